//! autonode-server: the control plane half of autonode.

#![forbid(unsafe_code)]

use autonode_server::logfmt::{JsonFields, JsonLines, TextFields};
use clap::{Parser, Subcommand};

mod cmd;

use cmd::{config, identity, ignition, render_userdata, serve};

/// The server allocates with jemalloc, not the C library's malloc: a join
/// is many small, short-lived allocations (JSON, TLS records, Kubernetes
/// objects) across the runtime's threads, and glibc's malloc was a fifth
/// of the server's CPU in a burst. jemalloc took a tenth off the server's
/// CPU a join at the same peak memory (docs/benchmarks.md, "Issue 51, ninth
/// step"). Its symbols are prefixed, so only Rust's allocations use it;
/// `_RJEM_MALLOC_CONF` tunes it (docs/operations.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Decides which EC2 instances become nodes of this cluster, approves their
/// certificates and serves their configuration.
#[derive(Debug, Parser)]
#[command(name = "autonode-server", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect and verify EC2 instance identity signatures.
    Identity(identity::IdentityArgs),
    /// Check Ignition configs as the server does before serving them.
    Ignition(ignition::IgnitionArgs),
    /// Serve the join API and watch the guest cluster.
    Serve(Box<config::ServeArgs>),
    /// Print the EC2NodeClass userData (the agent's config) that `serve`
    /// keeps, from the same flags.
    RenderUserdata(render_userdata::RenderArgs),
}

fn main() -> anyhow::Result<()> {
    let args = config::expand_config_file::<Cli>(std::env::args_os().collect())?;
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::Identity(args) => identity::run(args),
        // Its own exit statuses: 1 refused, 2 unreadable (see its --help).
        Command::Ignition(args) => std::process::exit(ignition::run(&args)),
        Command::RenderUserdata(args) => render_userdata::run(args),
        Command::Serve(args) if args.check_config => {
            args.check()?;
            println!("autonode-server serve: settings accepted");
            Ok(())
        }
        Command::Serve(args) => {
            init_logging(&args.log_format)?;
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(usize::from(args.worker_threads))
                .enable_all()
                .build()?
                .block_on(serve::run(*args))
        }
    }
}

/// Logs to stderr as text or JSON lines, every field escaped and bounded;
/// `RUST_LOG` filters (default info).
fn init_logging(format: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Both formats escape and bound every field (autonode_server::logfmt):
    // much of what is logged comes from requests.
    match format {
        "json" => builder
            .fmt_fields(JsonFields)
            .event_format(JsonLines)
            .init(),
        "text" => builder.fmt_fields(TextFields).init(),
        other => anyhow::bail!("--log-format must be text or json, not {other}"),
    }
    Ok(())
}
