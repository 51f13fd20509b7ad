//! The config phase's work: the three layers (userData < local file <
//! flags) read, layered and validated into one [`Settings`] value that
//! holds everything later phases need, so no phase reads the command line.

use super::{
    parse_deadline, parse_document, refuse_in_user_data, Config, ConfigError, Document, Options,
    UserDataDocument,
};
use crate::fsutil::{FsError, Root};
use crate::imds::{EndpointChoice, EndpointError, EndpointMode, ImdsError, MODE_KEY};
use crate::retry::Deadline;
use std::path::PathBuf;

/// What the command line says: the top layer of the config, and the
/// node-local facts that never come from userData.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// The local config file (`--config-file`), under the root.
    pub config_file: String,
    /// `--no-user-data`: the local file and flags hold all of it.
    pub no_user_data: bool,
    pub server_url: Option<String>,
    /// `--server-ca-file`: read as given, not under the root.
    pub server_ca_file: Option<PathBuf>,
    pub server_ca_sha256: Option<String>,
    pub cluster_name: Option<String>,
    pub deadline: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub imds_endpoint: Option<String>,
    pub imds_endpoint_mode: Option<String>,
    pub node: Node,
}

/// How this node runs kubelet: set by the AMI (flags), never by userData.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    /// systemctl to run.
    pub systemctl: String,
    /// The kubelet binary kubelet.service runs, outside any root.
    pub kubelet_path: String,
    /// Whether the agent starts kubelet.service itself.
    pub start_kubelet: bool,
}

/// Everything the phases after config need to know.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config: Config,
    /// How IMDS is reached.
    pub imds: EndpointChoice,
    pub node: Node,
}

/// Why the config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Root(#[from] FsError),
    #[error("{path}")]
    LocalFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--server-ca-file {path}")]
    CaFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The deadline that bounds reading userData itself.
    #[error("deadline")]
    EarlyDeadline(#[source] ConfigError),
    #[error(transparent)]
    Mode(ImdsError),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("reading userData")]
    UserData(#[source] ImdsError),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// userData < local file < flags, validated.
pub async fn load(flags: &Flags, root: &Root) -> Result<Settings, LoadError> {
    let local = read_local_file(root, &flags.config_file)?;
    let upper = local.overlay(flag_document(flags)?);
    let user_data = if flags.no_user_data {
        UserDataDocument::Config(Document::default())
    } else {
        read_user_data(flags, &upper).await?
    };
    let (config, ignored) = Config::resolve_layers(user_data, upper)?;
    if let Some(found) = ignored {
        // Not an error: an AMI with a complete local config may run under
        // any userData (a script, a cloud-config, Bottlerocket settings).
        log::info!(
            "userData holds no autonode config ({found}); using {} and flags",
            flags.config_file
        );
    }
    Ok(Settings {
        imds: endpoint_choice(flags, config.imds_endpoint_mode),
        config,
        node: flags.node.clone(),
    })
}

fn endpoint_choice(flags: &Flags, config_mode: Option<EndpointMode>) -> EndpointChoice {
    EndpointChoice {
        flag_endpoint: flags.imds_endpoint.clone(),
        flag_mode: flags.imds_endpoint_mode.clone(),
        config_mode,
    }
}

/// userData, read within the deadline the upper layers set (userData may
/// set another one, for the phases after it).
async fn read_user_data(flags: &Flags, upper: &Document) -> Result<UserDataDocument, LoadError> {
    let early = upper.options.deadline.as_deref().map(parse_deadline);
    let early = early.transpose().map_err(LoadError::EarlyDeadline)?;
    let mode = upper.options.imds_endpoint_mode.as_deref();
    let mode = mode.map(|m| EndpointMode::parse(m, MODE_KEY));
    let mode = mode.transpose().map_err(LoadError::Mode)?;
    let deadline = Deadline::after(early.unwrap_or(super::DEFAULT_DEADLINE));
    let imds = endpoint_choice(flags, mode).client(deadline)?;
    let raw = imds.user_data().await.map_err(LoadError::UserData)?;
    let read = UserDataDocument::read(raw.as_deref().unwrap_or_default())?;
    if let Some(document) = read.document() {
        refuse_in_user_data(document)?;
    }
    Ok(read)
}

fn read_local_file(root: &Root, path: &str) -> Result<Document, LoadError> {
    let path = root.join(path)?;
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(parse_document(&text, &path.display().to_string())?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Document::default()),
        Err(source) => Err(LoadError::LocalFile {
            path: path.display().to_string(),
            source,
        }),
    }
}

fn flag_document(flags: &Flags) -> Result<Document, LoadError> {
    let server_ca = match &flags.server_ca_file {
        Some(path) => Some(
            std::fs::read_to_string(path).map_err(|source| LoadError::CaFile {
                path: path.display().to_string(),
                source,
            })?,
        ),
        None => None,
    };
    Ok(Document {
        server_url: flags.server_url.clone(),
        server_ca,
        server_ca_sha256: flags.server_ca_sha256.clone(),
        cluster_name: flags.cluster_name.clone(),
        options: Options {
            deadline: flags.deadline.clone(),
            // A document holds text; the state dir is used as text too
            // (see crate::phases::config), so nothing is lost here.
            state_dir: flags
                .state_dir
                .as_ref()
                .map(|dir| dir.to_string_lossy().into_owned()),
            ..Options::default()
        },
    })
}
