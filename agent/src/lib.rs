//! autonode-agent as a library: everything but the command line.
//!
//! The binary (`main.rs`, its `phases`) runs the one-way flow
//! config → identity → keys → join → apply → start; the work of each step
//! is a module here with one job:
//!
//! - [`config`]: the TOML document and its validation; [`config::load`]
//!   layers userData < local file < flags into the run's settings.
//! - [`imds`]: IMDSv2, one method per datum ([`imds::Imds::user_data`],
//!   [`imds::Imds::identity`], ...), and the choice of endpoint.
//! - [`keys`], [`csr`]: the node's two keys and their CSRs.
//! - [`join`]: the join request, and the check of the server's answer
//!   before any of it is used.
//! - [`nitrotpm`]: the machine's attestation evidence, from AWS's
//!   `nitro-tpm-attest` tool, for the join.
//! - [`server_client`]: the HTTPS client the join and [`report`]s share;
//!   [`trust`] decides whom it trusts, [`proxy`] how it gets there.
//! - [`ignition`], [`kubelet`]: what the answer is applied with.
//! - [`state`]: what earlier runs achieved.
//!
//! The pure parsers ([`userdata`], [`config`], and the Ignition spec
//! [`autonode_shared::ignition`] that [`ignition`] applies) take
//! bytes and return typed values or typed errors, so fuzz targets,
//! integration tests and the server can call them.

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
pub mod nitrotpm;
pub mod proxy;
pub mod report;
pub mod retry;
pub mod server_client;
pub mod state;
pub mod trust;
pub mod userdata;
