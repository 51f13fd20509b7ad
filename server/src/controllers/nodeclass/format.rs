//! Which userData format a class asks for, by its [`FORMAT_ANNOTATION`],
//! and the warning, once per value, when it names none.

use super::Context;
use crate::controllers::nodeclass::userdata::{Format, UnknownFormat, FORMAT_ANNOTATION};
use crate::kube::karpenter::Ec2NodeClass;
use crate::kube::reason::Reason;
use kube::ResourceExt;
use std::sync::PoisonError;

/// The userData format `class` asks for with [`FORMAT_ANNOTATION`], as
/// the class is now: [`Format::Toml`] when it is absent, an error naming
/// the value when it names no format.
///
/// The annotation is trusted as it stands, whoever set it: it is the
/// choice of the class's owners, who may as well write the userData
/// itself; it only picks which of autonode's own renderings is kept.
pub fn format_of(class: &Ec2NodeClass) -> Result<Format, UnknownFormat> {
    match class.annotations().get(FORMAT_ANNOTATION) {
        Some(value) => Format::parse(value),
        None => Ok(Format::default()),
    }
}

impl Context {
    /// The format `class` asks for, or `None` after warning (once per
    /// value) that its annotation names none: the class is then left as it
    /// is, every kept field, until the annotation is fixed. Keeping the
    /// rest would need an apply, and an apply without userData would remove
    /// the class's userData (server-side apply drops what its manager
    /// leaves out).
    pub(super) fn format_of(&self, class: &Ec2NodeClass, name: &str) -> Option<Format> {
        let mut refused = self
            .refused_format
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let unknown = match format_of(class) {
            Ok(format) => {
                refused.remove(name);
                return Some(format);
            }
            Err(unknown) => unknown,
        };
        let key = format!(
            "{}/{}",
            class.metadata.uid.as_deref().unwrap_or(""),
            unknown.0
        );
        if refused.get(name) == Some(&key) {
            return None;
        }
        refused.insert(name.to_string(), key);
        drop(refused);
        tracing::warn!(
            nodeclass = %name,
            annotation = FORMAT_ANNOTATION,
            value = %unknown.0,
            "EC2NodeClass left as it is: its userData format annotation is unknown"
        );
        self.settings.events.warning(
            class,
            Reason::UserDataFormatUnknown,
            format!(
                "annotation {FORMAT_ANNOTATION}: {unknown}. autonode-server leaves this \
                 EC2NodeClass as it is (its userData and every other field) until the \
                 annotation is fixed or removed"
            ),
        );
        None
    }
}
