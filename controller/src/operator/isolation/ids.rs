//! Network IDs (VNIs) as values: the canonical decimal form, the configured range and the
//! order in which an allocator tries candidates. No IO here.

use std::fmt;

/// The largest ID a VXLAN-style 24-bit VNI can hold.
pub const MAX_ID: u32 = (1 << 24) - 1;

/// Why a configured range is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// `min` is zero.
    #[error("the smallest network ID is 1, got --min-vni={0}")]
    ZeroMin(u32),
    /// `max` exceeds [`MAX_ID`].
    #[error("--max-vni={0} exceeds the largest 24-bit ID {MAX_ID}")]
    MaxTooLarge(u32),
    /// `min > max`.
    #[error("--min-vni={min} is larger than --max-vni={max}")]
    Inverted {
        /// Lower bound.
        min: u32,
        /// Upper bound.
        max: u32,
    },
}

/// Why a string is not a network ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not a network ID in canonical decimal form (digits, no sign, no leading zero)"
)]
pub struct InvalidId {
    /// The rejected text.
    pub value: String,
}

/// Parses an ID in canonical decimal form: `"200"` but not `"0200"`, `"+200"` or `" 200"`,
/// so that the NetworkId object name and the ID recorded on the Network always agree.
pub fn parse_canonical(value: &str) -> Result<u32, InvalidId> {
    let invalid = || InvalidId {
        value: value.to_owned(),
    };
    let canonical_shape = !value.is_empty()
        && value.len() <= 10
        && value.bytes().all(|b| b.is_ascii_digit())
        && (value == "0" || !value.starts_with('0'));
    if !canonical_shape {
        return Err(invalid());
    }
    value.parse::<u32>().map_err(|_| invalid())
}

/// The inclusive range of IDs an allocator may hand out (`--min-vni..=--max-vni`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    min: u32,
    max: u32,
}

impl IdRange {
    /// Validates `min..=max`; a range of a single ID is allowed.
    pub fn new(min: u32, max: u32) -> Result<Self, RangeError> {
        if min == 0 {
            return Err(RangeError::ZeroMin(min));
        }
        if max > MAX_ID {
            return Err(RangeError::MaxTooLarge(max));
        }
        if min > max {
            return Err(RangeError::Inverted { min, max });
        }
        Ok(Self { min, max })
    }

    /// Smallest ID.
    pub fn min(&self) -> u32 {
        self.min
    }

    /// Largest ID.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Number of IDs in the range (never zero).
    pub fn size(&self) -> u32 {
        self.max - self.min + 1
    }

    /// True when `id` lies in the range.
    pub fn contains(&self, id: u32) -> bool {
        (self.min..=self.max).contains(&id)
    }

    /// The start for [`Self::candidates`] derived from any random number: uniform over the
    /// whole range (unlike ironcore-net, `max` can be a start too).
    pub fn start_from(&self, random: u32) -> u32 {
        self.min + random % self.size()
    }

    /// Every ID of the range exactly once: `start..=max`, then `min..start`. A `start` outside
    /// the range is clamped into it.
    pub fn candidates(&self, start: u32) -> Candidates {
        Candidates {
            range: *self,
            next: start.clamp(self.min, self.max),
            remaining: self.size(),
        }
    }
}

impl fmt::Display for IdRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {}]", self.min, self.max)
    }
}

/// Iterator over candidate IDs, see [`IdRange::candidates`].
#[derive(Debug, Clone)]
pub struct Candidates {
    range: IdRange,
    next: u32,
    remaining: u32,
}

impl Iterator for Candidates {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let id = self.next;
        self.next = if id == self.range.max {
            self.range.min
        } else {
            id + 1
        };
        Some(id)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Candidates {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn canonical_ids_parse_and_others_do_not() {
        assert_eq!(parse_canonical("200"), Ok(200));
        assert_eq!(parse_canonical("0"), Ok(0));
        assert_eq!(parse_canonical("16777215"), Ok(16_777_215));
        for bad in [
            "",
            "0200",
            "+200",
            "-5",
            " 200",
            "200 ",
            "2e3",
            "0x10",
            "99999999999",
        ] {
            assert!(parse_canonical(bad).is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn invalid_ranges_are_rejected() {
        assert_eq!(IdRange::new(0, 10), Err(RangeError::ZeroMin(0)));
        assert_eq!(
            IdRange::new(10, 9),
            Err(RangeError::Inverted { min: 10, max: 9 })
        );
        assert_eq!(
            IdRange::new(1, MAX_ID + 1),
            Err(RangeError::MaxTooLarge(MAX_ID + 1))
        );
        assert!(IdRange::new(7, 7).is_ok(), "a single-ID range is valid");
    }

    #[test]
    fn candidates_wrap_after_max() {
        let range = IdRange::new(200, 203).expect("valid");
        assert_eq!(
            range.candidates(202).collect::<Vec<_>>(),
            vec![202, 203, 200, 201]
        );
        assert_eq!(
            range.candidates(203).collect::<Vec<_>>(),
            vec![203, 200, 201, 202]
        );
        assert_eq!(
            range.candidates(5).collect::<Vec<_>>(),
            vec![200, 201, 202, 203]
        );
    }

    #[test]
    fn full_24_bit_range_has_the_expected_size() {
        let range = IdRange::new(1, MAX_ID).expect("valid");
        assert_eq!(range.candidates(MAX_ID).len(), MAX_ID as usize);
    }

    proptest! {
        #[test]
        fn candidates_visit_every_id_once(min in 1u32..1000, span in 0u32..300, random: u32) {
            let range = IdRange::new(min, min + span).expect("valid");
            let start = range.start_from(random);
            prop_assert!(range.contains(start));
            let mut seen: Vec<u32> = range.candidates(start).collect();
            prop_assert_eq!(seen.first().copied(), Some(start));
            seen.sort_unstable();
            let all: Vec<u32> = (range.min()..=range.max()).collect();
            prop_assert_eq!(seen, all);
        }
    }
}
