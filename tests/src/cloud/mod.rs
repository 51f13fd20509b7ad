//! The two clouds: the project's own fake AWS, which answers what autonode
//! asks, and moto, which answers what the real Karpenter asks.

pub mod fakecloud;
pub mod moto;
