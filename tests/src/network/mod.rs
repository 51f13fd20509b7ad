//! The network between the parts: namespaces that look like an instance's
//! network, a relay a test can cut, and an egress proxy stand-in.

pub mod blip;
pub mod netns;
pub mod proxy;
