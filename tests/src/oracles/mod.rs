//! The judges of what autonode writes: the real Ignition for its Ignition
//! support, and a PromQL reader for the alerts and dashboards it ships.

pub mod ignition;
pub mod promql;
