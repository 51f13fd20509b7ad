//! The HTTPS front: what agents and Prometheus talk to. The join API and
//! its gate, the serving certificate, the probes and the report endpoint;
//! each hands its work to the join or to the Kubernetes plumbing.

pub mod api;
pub mod probes;
pub mod report;
pub mod tls;
