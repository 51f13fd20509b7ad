//! Which userData format a class is kept in, by its [`FORMAT_ANNOTATION`],
//! and the warning, once per value, when the annotation names none.

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
/// The annotation is trusted as it stands, whoever set it: it only picks
/// which of autonode's own renderings is kept, never whether one is.
pub fn format_of(class: &Ec2NodeClass) -> Result<Format, UnknownFormat> {
    match class.annotations().get(FORMAT_ANNOTATION) {
        Some(value) => Format::parse(value),
        None => Ok(Format::default()),
    }
}

impl Context {
    /// The format `class` is kept in. An annotation naming no format is
    /// ignored, with a warning once per value: the class keeps the
    /// rendering its userData already is, or else the default one. It
    /// never stops the upkeep, or whoever may edit the class could keep
    /// their own userData, AMI and metadata options by adding a bad value.
    pub(super) fn format_of(&self, class: &Ec2NodeClass, name: &str) -> Format {
        let mut refused = self
            .refused_format
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let unknown = match format_of(class) {
            Ok(format) => {
                refused.remove(name);
                return format;
            }
            Err(unknown) => unknown,
        };
        let format = self.format_kept(class);
        let key = format!(
            "{}/{}",
            class.metadata.uid.as_deref().unwrap_or(""),
            unknown.0
        );
        if refused.get(name) == Some(&key) {
            return format;
        }
        refused.insert(name.to_string(), key);
        drop(refused);
        tracing::warn!(
            nodeclass = %name,
            annotation = FORMAT_ANNOTATION,
            value = %unknown.0,
            format = format.as_str(),
            "EC2NodeClass's userData format annotation is unknown and ignored"
        );
        self.settings.events.warning(
            class,
            Reason::UserDataFormatUnknown,
            format!(
                "annotation {FORMAT_ANNOTATION}: {unknown}. autonode-server ignores it and \
                 keeps this EC2NodeClass's userData in the {} form, with its other kept fields",
                format.as_str()
            ),
        );
        format
    }

    /// The format of autonode's renderings that `class`'s userData is now
    /// (a class that was kept keeps its form through a typo), else the
    /// default: a userData of anyone else's is never a reason to keep it.
    fn format_kept(&self, class: &Ec2NodeClass) -> Format {
        let rendered = &self.settings.desired.user_data;
        let user_data = class.spec.user_data.as_deref();
        Format::ALL
            .into_iter()
            .find(|format| user_data == Some(rendered.get(*format)))
            .unwrap_or_default()
    }
}
