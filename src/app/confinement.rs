//! What a run's sandboxes mean for it: the hold-out each role had (SPEC §3), checked against
//! `--require-sandbox` before anything is called, and what a sandbox denied a failed call.

use std::collections::BTreeMap;

use super::prepare::{Confinements, Prepared};
use crate::error::{Error, Invalid, Problem};
use crate::exec::sandbox::{self, Sandboxing};
use crate::protocol::Role;

/// Per role, whether the hold-out is enforced. A compressor or reader left unsandboxed for
/// any reason but its own `sandbox = false` is warned about once, and is an error under
/// `--require-sandbox` (as is an opt-out).
pub(super) fn enforce_holdout(
    confinements: &Confinements,
    require_sandbox: bool,
) -> Result<BTreeMap<Role, sandbox::HoldoutEnforcement>, Error> {
    let unsandboxed: Vec<(&str, &str)> = confinements
        .iter()
        .filter(|(role, _, c)| *role != Role::Judge && !c.sandboxed())
        .map(|(_, name, c)| (name.as_str(), c.why.as_deref().unwrap_or("")))
        .collect();
    if require_sandbox && !unsandboxed.is_empty() {
        return Err(Invalid(
            unsandboxed
                .iter()
                .map(|(name, why)| Problem {
                    place: "--require-sandbox".into(),
                    message: format!("`{name}` would run outside its sandbox: {why}"),
                })
                .collect(),
        )
        .into());
    }
    let unexpected: Vec<String> = unsandboxed
        .iter()
        .filter(|(_, why)| *why != "sandbox = false")
        .map(|(name, why)| format!("{name} ({why})"))
        .collect();
    if !unexpected.is_empty() {
        let message = format!(
            "the hold-out is NOT enforced: {} run unsandboxed; --require-sandbox makes this an error",
            unexpected.join(", ")
        );
        eprintln!("warning: {message}");
    }
    Ok(sandbox::holdout_enforcement(
        confinements
            .iter()
            .map(|(role, name, c)| (*role, name.as_str(), c)),
    ))
}

/// Per failure, what its sandbox denied, when its callback ran sandboxed and its stderr says.
pub(super) fn denial_hints(
    failures: &[crate::store::ledger::FailureRow],
    confinements: &Confinements,
    sandboxing: &Sandboxing,
    prepared: &Prepared,
) -> Vec<Option<String>> {
    let sandboxed = |name: &str| confinements.iter().any(|(_, n, c)| n == name && c.sandboxed());
    failures
        .iter()
        .map(|failure| {
            sandboxed(&failure.callback)
                .then(|| {
                    sandbox::denial_hint(
                        &failure.stderr_tail,
                        sandboxing.protected(),
                        &prepared.loaded.folder,
                    )
                })
                .flatten()
        })
        .collect()
}
