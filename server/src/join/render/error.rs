//! Why an operator's Ignition config cannot be used.

use autonode_shared::ignition::SpecError;

/// Why an operator's Ignition config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IgnitionError {
    #[error("{origin}: not JSON: {error}")]
    Json { origin: String, error: String },
    #[error("{origin}: {error}")]
    Spec { origin: String, error: SpecError },
    /// The merge of checked layers broke a rule (a defect: each layer was
    /// valid, and later entries replace earlier ones whole).
    #[error("the merged Ignition config is refused: {0}")]
    Merged(SpecError),
    #[error("writing the merged Ignition config: {0}")]
    Write(#[from] serde_json::Error),
}
