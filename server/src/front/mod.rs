//! The HTTPS front: what agents and Prometheus talk to. Transport only: the
//! join API and its gate (routing, TLS, body limits, status codes), the
//! serving certificate and the probes; a join is handed to
//! [`crate::join`], a report to [`crate::report`].

pub mod api;
pub mod probes;
pub mod tls;
