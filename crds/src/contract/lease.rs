//! The Lease the gateway replicas elect a leader with: written by the controller, read by
//! the route agent (where to send remote traffic) and the lab.

/// Annotation on the Lease naming the underlay IP of the holder's node: where the route
/// agents send traffic for remote clusters.
pub const NODE_IP_ANNOTATION: &str = "net.kubetun.io/gateway-node-ip";
/// The Lease's name unless configured otherwise.
pub const DEFAULT_LEASE_NAME: &str = "kubetun-gateway";
