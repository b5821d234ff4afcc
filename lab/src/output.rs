//! What the lab prints while it works: a line, and a check with its mark.

use std::io::Write;

use crate::checks::Check;

/// Prints a check as `[ok  ]` or `[FAIL]`, its description and what was seen.
pub(crate) fn report_check(out: &mut dyn Write, check: &Check) {
    let mark = if check.passed { "ok  " } else { "FAIL" };
    say(
        out,
        &format!("    [{mark}] {} — {}", check.description, check.detail),
    );
}

/// Prints `line` and flushes, so that progress shows as it happens.
pub(crate) fn say(out: &mut dyn Write, line: &str) {
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
