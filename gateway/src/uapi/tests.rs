//! Unit tests of the UAPI parser, the `set` semantics and the `get` format.
