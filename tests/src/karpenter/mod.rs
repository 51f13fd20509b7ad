//! The two Karpenters: the stand-in, which writes Karpenter's objects for
//! tests that need them and not its decisions, and the real controller,
//! run against moto. The scenarios around the real one are in
//! [`crate::fleet`].

pub mod real;
pub mod standin;
