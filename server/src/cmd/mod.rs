//! The binary's subcommands, each with its flags; `main` parses the
//! command line and hands it to one of these.

pub mod config;
pub mod identity;
pub mod ignition;
pub mod render_userdata;
pub mod serve;
