//! One reconcile of a class: compare, and when a kept field differs or is
//! let go of, write the class once, with a copy of the rollout guard's
//! state; then record the state in its store.

use super::fields::{applied, drift, pinned};
use super::handover::{applied_paths, handover, released, report_released, SpecPath};
use super::{Context, Desired, Error, MetadataOptionsPolicy, FIELD_MANAGER, HANDOVER_MANAGER};
use crate::controllers::nodeclass::rollout::cluster::{applied_at, Source};
use crate::controllers::nodeclass::rollout::{self, Plan};
use crate::controllers::nodeclass::userdata::Format;
use crate::kube::events::Events;
use crate::kube::karpenter::Ec2NodeClass;
use crate::kube::reason::Reason;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::ResourceExt;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

impl Context {
    /// One server-side apply to class `name`, counted as a write.
    pub(super) async fn apply(
        &self,
        name: &str,
        params: &PatchParams,
        body: Value,
    ) -> Result<Ec2NodeClass, Error> {
        let written = self
            .api
            .patch(name, params, &Patch::Apply(body))
            .await
            .map_err(|source| Error::Apply {
                name: name.to_string(),
                source,
            })?;
        self.settings.metrics.nodeclass_writes.inc();
        Ok(written)
    }
}

pub(super) async fn reconcile(
    class: Arc<Ec2NodeClass>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let settings = &ctx.settings;
    let name = class.name_any();
    if !settings.keeps(&name) {
        // Not among the names the operator gave: a name never changes, so
        // no later edit of this class can bring it in or take it out.
        return Ok(Action::await_change());
    }
    settings.metrics.nodeclass_checks.inc();
    if ctx.superseded(&name, &class) {
        // The apply after the handover wakes the class again, with the
        // version it wrote.
        return Ok(Action::requeue(settings.resync));
    }
    if settings.desired.metadata_options == MetadataOptionsPolicy::LeaveAlone {
        ctx.warn_exposures(&class, &name);
    }
    let format = ctx.format_of(&class, &name);
    let source = ctx.source(&class, &name).await?;
    let plan = ctx.guard(&class, &name, format, source.clone());
    keep(&ctx, &class, &name, format, &source, &plan).await
}

/// Makes `class` what `plan` (decided on the state `source` held) calls
/// for: writes the class when a kept field differs, is let go of, or the
/// copy of the state on it is not the plan's; records the state in the
/// store when it changed.
async fn keep(
    ctx: &Context,
    class: &Ec2NodeClass,
    name: &str,
    format: Format,
    source: &Source,
    plan: &Plan,
) -> Result<Action, Error> {
    let settings = &ctx.settings;
    let desired = pinned(&settings.desired, &plan.target);
    let fields = drift(&class.spec, &desired, format);
    let released = released(&class.metadata, &desired);
    let annotated = rollout::read_state(class, &settings.rollout.key)
        .ok()
        .flatten()
        .is_some_and(|read| rollout::unchanged_but_start(&read, &plan.state));
    if fields.is_empty() && released.is_empty() && annotated {
        if behind(source, plan) {
            ctx.record(class, name, &plan.state).await?;
        }
        tracing::debug!(nodeclass = %name, "EC2NodeClass as rendered");
        ctx.announce(class, name, plan);
        ctx.mark_status(class, name, plan).await;
        return Ok(Action::requeue(settings.resync));
    }
    // Checked before the class changes: values applied under a state that
    // could not be recorded would run unguarded, but for those that are
    // safe without a record.
    let fits = !source.is_store() || ctx.fits(class, name, &plan.state).await;
    if !fits && !safe_unrecorded(source, plan, &settings.desired.values(format)) {
        return Ok(Action::requeue(settings.resync));
    }
    let Some(written) = write(ctx, class, &desired, format, &released, plan).await? else {
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    let restored = written.class;
    if source.is_store() && fits {
        let state = started(&plan.state, &restored, written.changed);
        ctx.record(&restored, name, &state).await?;
    }
    // Told once: from this apply on, autonode owns none of them.
    report_released(&restored, name, &released, &settings.events);
    if !fields.is_empty() {
        let rendered = plan.target == settings.desired.values(format);
        report_restored(&restored, name, &fields, format, rendered, &settings.events);
    }
    ctx.announce(&restored, name, plan);
    ctx.mark_status(&restored, name, plan).await;
    Ok(Action::requeue(settings.resync))
}

/// Whether `plan` may be applied though its state cannot be recorded in
/// the store (no room: see [`rollout::store::StoreError::is_full`]): it
/// puts back the good values the store holds (a revert), or gives a class
/// the store has no entry for the `rendered` values, with no other good
/// values to lose. Its state then stays on the class alone (sealed), as
/// before the store. Anything else (new values over good ones) waits: a
/// trial the store does not hold could be forgotten by deleting the
/// class's annotation, and a revert with it.
fn safe_unrecorded(source: &Source, plan: &Plan, rendered: &rollout::Values) -> bool {
    match source {
        Source::Stored(state) => state.good.as_ref() == Some(&plan.target),
        Source::Carried => {
            &plan.target == rendered && plan.state.good.as_ref().is_none_or(|g| g == rendered)
        }
        Source::Annotation => true,
    }
}

/// Whether the store falls behind `plan`: its state changed, or the class
/// has no entry yet (a state carried over from the annotation).
fn behind(source: &Source, plan: &Plan) -> bool {
    match source {
        Source::Stored(state) => **state != plan.state,
        Source::Carried => true,
        Source::Annotation => false,
    }
}

/// `state` with a trial that has no start yet started at autonode's own
/// apply: its managedFields entry's time in the response to that apply
/// (the API server's clock, which stamps the NodeClaims too), when the
/// apply `changed` the class. A no-op apply's entry keeps the time of the
/// last write made as autonode-server, which may be anyone's.
pub(super) fn started(
    state: &rollout::State,
    written: &Ec2NodeClass,
    changed: bool,
) -> rollout::State {
    let mut state = state.clone();
    if let Some(trial) = state.trial.as_mut().filter(|t| t.since.is_none()) {
        trial.since = applied_at(written).filter(|_| changed);
    }
    state
}

/// The class as autonode's apply left it, and whether that apply changed
/// it.
struct Written {
    class: Ec2NodeClass,
    changed: bool,
}

/// Writes `class` as `desired` (userData in `format`) with the rollout
/// guard's state from `plan`, after handing over the `released` fields;
/// with the class's resourceVersion as a precondition. `None` when the
/// class changed since it was read (often by our own write, not yet in the
/// store): it is decided again on the class as it is.
async fn write(
    ctx: &Context,
    class: &Ec2NodeClass,
    desired: &Desired,
    format: Format,
    released: &[SpecPath],
    plan: &Plan,
) -> Result<Option<Written>, Error> {
    let name = class.name_any();
    let mut version = class.metadata.resource_version.clone();
    let handed_before = applied_paths(&class.metadata, HANDOVER_MANAGER);
    if let Some(body) = handover(&name, &class.spec, released, &handed_before) {
        let written = ctx
            .apply(&name, &PatchParams::apply(HANDOVER_MANAGER), body)
            .await?;
        ctx.handed_over(&name, &written);
        version = written.metadata.resource_version.clone();
    }
    let mut body = applied(&name, desired, format);
    let uid = class.metadata.uid.as_deref().unwrap_or_default();
    let state = ctx
        .settings
        .rollout
        .key
        .seal(uid, &plan.state)
        .map_err(|source| Error::State {
            name: name.clone(),
            source,
        })?;
    body["metadata"]["annotations"] = json!({ rollout::ROLLOUT_ANNOTATION: state });
    body["metadata"]["resourceVersion"] = json!(&version);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match ctx.apply(&name, &params, body).await {
        Err(Error::Apply {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 409 => {
            tracing::debug!(nodeclass = %name, "EC2NodeClass changed since it was read; deciding again");
            Ok(None)
        }
        Err(error) => Err(error),
        Ok(class) => Ok(Some(Written {
            changed: class.metadata.resource_version != version,
            class,
        })),
    }
}

/// Logs and records an Event that `fields` were restored: to the rendered
/// values, or to those the rollout guard keeps instead.
fn report_restored(
    class: &Ec2NodeClass,
    name: &str,
    fields: &[&str],
    format: Format,
    rendered: bool,
    events: &Events,
) {
    let fields = fields.join(", ");
    let to = if rendered {
        "the rendered values"
    } else {
        "the values the rollout guard keeps (see the RolloutReverted, RolloutRefused or RolloutHeld Events)"
    };
    let format = format.as_str();
    tracing::info!(nodeclass = %name, %fields, %format, "EC2NodeClass restored");
    events.normal(
        class,
        Reason::NodeClassRestored,
        format!("autonode-server restored {fields} to {to}"),
    );
}
