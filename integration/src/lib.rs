//! kubetun lab and netns test support: builds clusters as network namespaces.
