//! The interception capability's resource: Intercept (steer a pod's traffic for some ports to an
//! agent in the same pod, programmed from the node into the pod's own namespace).
//! docs/intercept/resource.md describes its fields and status; docs/intercept/table.md the table.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::Protocol;

/// Programs the selected pods' namespaces so their traffic for each listed port reaches an agent.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "kuport.wlz.li",
    version = "v1alpha1",
    derive = "PartialEq",
    kind = "Intercept",
    namespaced,
    shortname = "icpt",
    status = "InterceptStatus",
    printcolumn = r#"{"name":"Selected","type":"integer","jsonPath":".status.selectedPods"}"#,
    printcolumn = r#"{"name":"Programmed","type":"integer","jsonPath":".status.programmedPods"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Programmed\")].reason"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct InterceptSpec {
    /// The pods of this namespace to program, by labels; `{}` selects every pod. A pod that is
    /// not Running, uses the host's network or another Intercept already holds is reported in
    /// status.pods, not programmed.
    pub pod_selector: PodSelector,
    /// The intercepted ports, 1 to 64, e.g. `{protocol: TCP, containerPort: 8080, agentPort:
    /// 9900}`; for a duplicate protocol and container port the first wins (Accepted reason
    /// DuplicatePort).
    #[x_kube(validation = Rule::new("size(self) >= 1").message("intercepts: at least one is needed"))]
    #[schemars(length(max = 64))]
    pub intercepts: Vec<InterceptPort>,
    /// How the table tells the agent's sockets from the application's: one of group, user or
    /// mark; default group 7439.
    #[serde(default)]
    pub agent: AgentIdentity,
    /// The mesh's dial subnets (CIDRs, at most 32), e.g. [10.96.0.0/12]: the agent's own traffic
    /// to them stays with the mesh. Default none.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("meshDialSubnets: each must be a CIDR such as 10.96.0.0/12"))]
    #[schemars(length(max = 32), inner(length(max = 43)))]
    pub mesh_dial_subnets: Vec<String>,
}

/// A pod selector by labels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSelector {
    /// Every label must match, e.g. `{app: web}`; empty selects every pod of the namespace.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// One intercepted port.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterceptPort {
    /// `TCP` or `UDP`.
    pub protocol: Protocol,
    /// The port the application listens on, 1-65535, e.g. 8080.
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65535").message("containerPort must be 1-65535"))]
    pub container_port: u32,
    /// The port the agent's forwarder listens on, 1-65535, e.g. 9900.
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65535").message("agentPort must be 1-65535"))]
    pub agent_port: u32,
    /// For a numeric target: the port the agent dials on the pod's address to reach the
    /// application directly, 1-65535; absent: none. It must not be an intercepted container
    /// port nor another intercept's proxy port (Accepted reason ProxyPortConflict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65535").message("proxyPort must be 1-65535"))]
    pub proxy_port: Option<u32>,
}

/// The agent's identity: exactly one of group, user, mark; none means group 7439.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.group) ? 1 : 0) + (has(self.user) ? 1 : 0) + (has(self.mark) ? 1 : 0) <= 1").message("agent: set one of group, user, mark"))]
pub struct AgentIdentity {
    /// The agent's group ID (`meta skgid`), e.g. 7439 (the default when none is set): the
    /// agent runs under a group no other container uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
    /// The agent's user ID (`meta skuid`): the agent runs as a user no other container uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<u32>,
    /// A socket mark (`meta mark`), not 0: for sockets whose owner cannot be matched, such as in
    /// a pod with its own user namespace (the agent sets SO_MARK).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("mark must not be 0"))]
    pub mark: Option<u32>,
}

/// What the controller made of an Intercept: the selected and programmed pods, and why any
/// selected pod is not programmed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterceptStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pods the selector matches.
    #[serde(default)]
    pub selected_pods: u32,
    /// Selected pods whose namespace holds the table, acknowledged by their node's executor.
    #[serde(default)]
    pub programmed_pods: u32,
    /// Each selected pod that is not programmed, and why.
    #[serde(default)]
    pub pods: Vec<PodProgress>,
    /// `Accepted` (the intercepts go into the tables; else the first refusal's reason, e.g.
    /// DuplicatePort) and `Programmed` (every selected pod is; else the pods' reason, e.g.
    /// HostNetwork). docs/intercept/resource.md lists every reason.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A selected pod that is not programmed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodProgress {
    /// The pod's name.
    pub name: String,
    /// The pod's node; empty when it has none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// Why it is not programmed, e.g. PodNotRunning, HostNetwork, AlreadyIntercepted or Pending.
    pub reason: String,
    /// The same in words.
    pub message: String,
}
