//! autonode-agent as a library: everything but the command line.
//!
//! The binary (`main.rs`) runs the one-way flow
//! config → identity → keys → join → apply → start; each step is a module
//! here with one job. The pure parsers ([`userdata`], [`config`],
//! [`ignition::spec`]) take bytes and return typed values or typed errors,
//! so fuzz targets, integration tests and the server can call them.

#![forbid(unsafe_code)]

pub mod config;
pub mod csr;
pub mod fsutil;
pub mod http;
pub mod ignition;
pub mod imds;
pub mod join;
pub mod keys;
pub mod kubelet;
pub mod logging;
pub mod proxy;
pub mod report;
pub mod retry;
pub mod state;
pub mod trust;
pub mod userdata;
