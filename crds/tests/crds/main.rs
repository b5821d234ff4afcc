//! The CRDs and the manifests, one test binary: the generated CRDs against their types and the
//! examples (`schema`), the install manifests in `deploy/` (`deploy`).

#![allow(clippy::unwrap_used)]

mod deploy;
mod schema;
