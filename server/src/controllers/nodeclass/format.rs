//! Which userData format a class is kept in, by its [`FORMAT_ANNOTATION`],
//! and the warning, once per value, when the annotation names none.

use super::Context;
use crate::controllers::nodeclass::userdata::{Format, UnknownFormat, FORMAT_ANNOTATION};
use crate::kube::karpenter::Ec2NodeClass;
use crate::kube::reason::Reason;
use kube::ResourceExt;

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

/// What [`Events::is_news`](crate::kube::events::Events::is_news) tells once
/// per value: an unknown format annotation.
const FORMAT_UNKNOWN_TOPIC: &str = "userdata-format-unknown";

impl Context {
    /// The format `class` is kept in. An annotation naming no format is
    /// ignored, with a warning once per value: the class keeps the
    /// rendering its userData already is, or else the default one. It
    /// never stops the upkeep, or whoever may edit the class could keep
    /// their own userData, AMI and metadata options by adding a bad value.
    pub(super) fn format_of(&self, class: &Ec2NodeClass, name: &str) -> Format {
        let unknown = match format_of(class) {
            Ok(format) => {
                self.settings.events.settled(class, FORMAT_UNKNOWN_TOPIC);
                return format;
            }
            Err(unknown) => unknown,
        };
        let format = self.format_kept(class);
        if !self
            .settings
            .events
            .is_news(class, FORMAT_UNKNOWN_TOPIC, &unknown.0)
        {
            return format;
        }
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
