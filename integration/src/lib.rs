//! kubetun lab and netns test support: builds clusters as network namespaces.
//!
//! - [`netns`]: namespace, veth and process fixtures that clean up on drop.

pub mod netns;
