//! Every reason autonode writes, in one list: the `reason` of its Events,
//! of the conditions it sets (`AutonodeBootstrapped` on NodeClaims,
//! `AutonodeRollout` on EC2NodeClasses) and of its CSR approvals.
//!
//! Operators select on these (`kubectl get events --field-selector
//! reason=JoinRefused`), alerts and runbooks name them, and docs/operations.md
//! lists them: they are a contract, so each is spelled once, here, and
//! [`Events`](crate::kube::events::Events) and
//! [`set_condition`](crate::kube::condition::set_condition) take a
//! [`Reason`], never a string.

/// A reason, as an Event, condition or approval carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    // The join.
    /// A join was granted: the instance attested and its certificates were
    /// issued (Event; the condition while kubelet has not registered).
    Attested,
    /// A join was refused (Event).
    JoinRefused,
    /// A join came with keys other than the ones bound: someone else may
    /// hold the identity document (Event).
    PossibleReplay,
    /// The NodeClaim is Registered to a Node that is not its machine: another
    /// node registered a Node with its instance's providerID (Event).
    NodeSpoofed,
    /// The class's or NodeClaim's node config could not be rendered (Event).
    NodeConfigInvalid,
    /// A kubelet setting the server could not fill in was left unset (Event).
    KubeletSettingsUnset,
    /// Approval of a join's CSR (the CSR's Approved condition).
    AutonodeAttested,
    /// Approval of a kubelet's renewal or serving CSR (the CSR's Approved
    /// condition).
    AutonodeRenewal,
    /// A kubelet CSR left pending because its node name was another
    /// instance's within a certificate's lifetime (Event, on the CSR).
    NodeNameReused,

    // The agent's reports.
    /// An agent finished a phase (Event).
    AgentProgress,
    /// An agent's phase failed and is being retried (Event).
    AgentRetrying,
    /// The machine failed to join for good (Event and condition).
    BootstrapFailed,
    /// NodeClaims of a NodePool and class keep failing for one reason with
    /// none Ready since: past the failure budget, kept marked instead of
    /// deleted (Event, on the NodePool and the EC2NodeClass).
    FailureBudgetSpent,
    /// NodeClaims are refused for a cause on autonode's side (its
    /// allow-lists, its clock): marked, never deleted (Event, on the
    /// NodePool and the EC2NodeClass).
    FailingOnServerSide,

    // After the join.
    /// kubelet registered the Node (Event and condition).
    NodeRegistered,
    /// The Node is Ready (Event and condition).
    NodeReady,
    /// The Node has less allocatable than its instance type promised
    /// (Event).
    CapacityShortfall,

    // EC2NodeClass upkeep.
    /// Fields a user changed were put back (Event).
    NodeClassRestored,
    /// Enforcement of the metadata options is off and the class exposes
    /// IMDS to pods (Event).
    InstanceMetadataExposed,
    /// autonode stopped managing the class's AMI selection (Event).
    AmiSelectionReleased,
    /// The class's userData format annotation names no format (Event).
    UserDataFormatUnknown,

    // The rollout guard.
    /// New values were applied and are on trial (Event).
    RolloutStarted,
    /// Values on trial made a Ready node (Event).
    RolloutPromoted,
    /// Values on trial failed and were put back (Event).
    RolloutReverted,
    /// Values reverted before are not applied again (Event).
    RolloutRefused,
    /// A hold keeps the class's values (Event).
    RolloutHeld,
    /// A hold on values autonode did not apply is ignored (Event).
    RolloutHoldIgnored,
    /// A rollout state autonode did not write is ignored (Event).
    RolloutStateRejected,
    /// The guard's store may not be used (RBAC): its state is kept on the
    /// class alone (Event).
    RolloutStoreUnavailable,
    /// The guard's store is full: new values are not applied (Event).
    RolloutStoreFull,
    /// The class runs values that made Ready nodes (condition).
    Settled,
    /// New values are on trial (condition).
    OnTrial,
    /// New values failed and were put back (condition).
    Reverted,
    /// A hold keeps the class's values (condition).
    Held,
}

impl Reason {
    /// Every reason, for the docs' check and the tests.
    pub const ALL: [Reason; 34] = [
        Reason::Attested,
        Reason::JoinRefused,
        Reason::PossibleReplay,
        Reason::NodeSpoofed,
        Reason::NodeConfigInvalid,
        Reason::KubeletSettingsUnset,
        Reason::AutonodeAttested,
        Reason::AutonodeRenewal,
        Reason::NodeNameReused,
        Reason::AgentProgress,
        Reason::AgentRetrying,
        Reason::BootstrapFailed,
        Reason::FailureBudgetSpent,
        Reason::FailingOnServerSide,
        Reason::NodeRegistered,
        Reason::NodeReady,
        Reason::CapacityShortfall,
        Reason::NodeClassRestored,
        Reason::InstanceMetadataExposed,
        Reason::AmiSelectionReleased,
        Reason::UserDataFormatUnknown,
        Reason::RolloutStarted,
        Reason::RolloutPromoted,
        Reason::RolloutReverted,
        Reason::RolloutRefused,
        Reason::RolloutHeld,
        Reason::RolloutHoldIgnored,
        Reason::RolloutStateRejected,
        Reason::RolloutStoreUnavailable,
        Reason::RolloutStoreFull,
        Reason::Settled,
        Reason::OnTrial,
        Reason::Reverted,
        Reason::Held,
    ];

    /// The reason as written: the variant's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Attested => "Attested",
            Reason::JoinRefused => "JoinRefused",
            Reason::PossibleReplay => "PossibleReplay",
            Reason::NodeSpoofed => "NodeSpoofed",
            Reason::NodeConfigInvalid => "NodeConfigInvalid",
            Reason::KubeletSettingsUnset => "KubeletSettingsUnset",
            Reason::AutonodeAttested => "AutonodeAttested",
            Reason::AutonodeRenewal => "AutonodeRenewal",
            Reason::NodeNameReused => "NodeNameReused",
            Reason::AgentProgress => "AgentProgress",
            Reason::AgentRetrying => "AgentRetrying",
            Reason::BootstrapFailed => "BootstrapFailed",
            Reason::FailureBudgetSpent => "FailureBudgetSpent",
            Reason::FailingOnServerSide => "FailingOnServerSide",
            Reason::NodeRegistered => "NodeRegistered",
            Reason::NodeReady => "NodeReady",
            Reason::CapacityShortfall => "CapacityShortfall",
            Reason::NodeClassRestored => "NodeClassRestored",
            Reason::InstanceMetadataExposed => "InstanceMetadataExposed",
            Reason::AmiSelectionReleased => "AmiSelectionReleased",
            Reason::UserDataFormatUnknown => "UserDataFormatUnknown",
            Reason::RolloutStarted => "RolloutStarted",
            Reason::RolloutPromoted => "RolloutPromoted",
            Reason::RolloutReverted => "RolloutReverted",
            Reason::RolloutRefused => "RolloutRefused",
            Reason::RolloutHeld => "RolloutHeld",
            Reason::RolloutHoldIgnored => "RolloutHoldIgnored",
            Reason::RolloutStateRejected => "RolloutStateRejected",
            Reason::RolloutStoreUnavailable => "RolloutStoreUnavailable",
            Reason::RolloutStoreFull => "RolloutStoreFull",
            Reason::Settled => "Settled",
            Reason::OnTrial => "OnTrial",
            Reason::Reverted => "Reverted",
            Reason::Held => "Held",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_reason_is_spelled_once_and_as_its_variant() {
        let spelled: HashSet<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            spelled.len(),
            Reason::ALL.len(),
            "two reasons share a spelling"
        );
        for reason in Reason::ALL {
            assert_eq!(format!("{reason:?}"), reason.as_str());
        }
    }
}
