//! A lab: the topology built from network namespaces and veths, with the topology's CNI
//! emulation on each node (Cilium-like, a bridge or Calico-like; see [`crate::cni`]) and an echo
//! server in each pod.
//!
//! Namespaces: one per node, pod and client, named `<lab id>-<host>`, and one switch namespace
//! `<lab id>_switch` holding a bridge per underlay network. The lab id is unique on the machine,
//! so labs run side by side; interface names repeat freely inside namespaces.
//!
//! Each node has the underlay interface (`wt0`), a veth into the switch's bridge for its
//! network; each public interface, a bridge whose ports are veths to the attached clients
//! (`lab-c*`), with a /32 route to each attached client's address; and the CNI's devices, routes
//! and masquerade.
//!
//! IPv6 rides beside IPv4 wherever the topology gives an `address6` (or a `podCidr6`): the
//! addresses are set `nodad` and every namespace skips duplicate address detection, so link-local
//! addresses too are usable at once; nodes forward IPv6 as they forward IPv4.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use kuport_controller::api::PortMapClassStatus;
use kuport_node_exec::executor::Executor;
use rustix::process::Signal;
use serde::{Deserialize, Serialize};

use crate::cni;
use crate::echo::PodServer;
use crate::manifests::Manifests;
use crate::objects::{Objects, generate};
use crate::plane::{Plane, PlaneOptions, PlaneRecord};
use crate::probe::{Answer, ProbeError, probe, probe_any};
use crate::process::{Lifetime, owned, signal, spawn, wait_gone};
use crate::sys::{self, ip_batch, netns_path, tc_batch};
use crate::topology::{ClientSpec, Cni, Nat, NatKind, NodeSpec, PodSpec, Ports, Protocol, Topology};

/// How long a probe waits by default.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How the pods' echo servers run.
#[derive(Debug, Clone, Default)]
pub enum ServerMode {
    /// On a runtime inside this process; they stop with the lab.
    #[default]
    InProcess,
    /// As detached `BIN serve` processes that outlive this one (`kuport-lab up`), logging to
    /// `log_dir`.
    Processes { bin: PathBuf, log_dir: PathBuf },
}

#[derive(Debug, Clone, Default)]
pub struct LabOptions {
    /// The lab id; a fresh unique one when None.
    pub id: Option<String>,
    pub servers: ServerMode,
}

/// What a lab is, enough to find and tear it down from another process.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub id: String,
    pub topology: Topology,
    /// Every namespace the lab made, in order.
    pub namespaces: Vec<String>,
    /// Echo server processes by pod.
    #[serde(default)]
    pub servers: BTreeMap<String, u32>,
    /// The class statuses last computed, fed back into the next computation as the
    /// controller's status writes would be.
    #[serde(default)]
    pub classes: BTreeMap<String, PortMapClassStatus>,
    /// The controller and executor processes, when they program the lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plane: Option<PlaneRecord>,
}

enum Servers {
    InProcess {
        rt: Option<tokio::runtime::Runtime>,
        pods: BTreeMap<String, PodServer>,
    },
    Processes {
        bin: PathBuf,
        log_dir: PathBuf,
        pids: BTreeMap<String, u32>,
    },
    /// Attached to a lab another process made: its servers are processes it knows by pid.
    Attached {
        pids: BTreeMap<String, u32>,
    },
}

pub struct Lab {
    id: String,
    topology: Topology,
    namespaces: Vec<String>,
    /// Tear everything down on drop.
    armed: bool,
    servers: Servers,
    pub(crate) executors: BTreeMap<String, Executor>,
    pub(crate) classes: BTreeMap<String, PortMapClassStatus>,
    /// The controller and executor processes, once started ([`Lab::start_plane`]).
    plane: Option<Plane>,
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lab").field("id", &self.id).field("namespaces", &self.namespaces).finish_non_exhaustive()
    }
}

/// A lab id no namespace on this machine uses yet.
fn fresh_id() -> anyhow::Result<String> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let existing = sys::netns_list()?;
    loop {
        let id = format!("kl{}x{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        if !existing.iter().any(|n| n.starts_with(&format!("{id}-")) || n.starts_with(&format!("{id}_"))) {
            return Ok(id);
        }
    }
}

impl Lab {
    /// Builds `topology` with in-process echo servers; everything is removed on drop.
    pub fn up(topology: &Topology) -> anyhow::Result<Lab> {
        Lab::create(topology, LabOptions::default())
    }

    pub fn create(topology: &Topology, options: LabOptions) -> anyhow::Result<Lab> {
        if !sys::is_root() {
            bail!("a lab needs root (network namespaces)");
        }
        topology.validate().map_err(|(field, reason)| anyhow!("topology: field {field}: {reason}"))?;
        let id = match options.id {
            Some(id) => id,
            None => fresh_id()?,
        };
        let servers = match options.servers {
            ServerMode::InProcess => Servers::InProcess {
                rt: Some(
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(1)
                        .thread_name(format!("{id}-echo"))
                        .enable_all()
                        .build()
                        .context("starting the echo servers' runtime")?,
                ),
                pods: BTreeMap::new(),
            },
            ServerMode::Processes { bin, log_dir } => Servers::Processes { bin, log_dir, pids: BTreeMap::new() },
        };
        let mut lab = Lab {
            id,
            topology: topology.clone(),
            namespaces: Vec::new(),
            armed: true,
            servers,
            executors: BTreeMap::new(),
            classes: BTreeMap::new(),
            plane: None,
        };
        // On any error the half-built lab is dropped, which removes what it made.
        lab.build()?;
        Ok(lab)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The namespace name of a host (node, pod or client).
    pub fn netns_name(&self, host: &str) -> String {
        format!("{}-{host}", self.id)
    }

    /// The namespace of a host, checked to exist in the topology.
    pub fn netns(&self, host: &str) -> anyhow::Result<PathBuf> {
        if !self.topology.hosts().iter().any(|(h, _)| h == host) {
            let names: Vec<_> = self.topology.hosts().iter().map(|(h, _)| h.to_string()).collect();
            bail!("no host {host:?} in this lab (hosts: {})", names.join(", "));
        }
        Ok(netns_path(&self.netns_name(host)))
    }

    fn switch(&self) -> String {
        format!("{}_switch", self.id)
    }

    /// Every namespace the lab has made.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// The cluster objects the lab's topology stands for.
    pub fn objects(&self) -> Objects {
        generate(&self.topology)
    }

    fn add_netns(&mut self, name: String) -> anyhow::Result<()> {
        sys::run("ip", &["netns", "add", &name], None)?;
        self.namespaces.push(name.clone());
        // No duplicate address detection for the devices made in it: their link-local
        // addresses (Calico's IPv6 gateway is one) are usable at once, like the lab's nodad ones.
        sys::sysctls(
            &netns_path(&name),
            &[("net.ipv6.conf.all.accept_dad", "0"), ("net.ipv6.conf.default.accept_dad", "0")],
        )
    }

    fn build(&mut self) -> anyhow::Result<()> {
        let t = self.topology.clone();
        let switch = self.switch();
        self.add_netns(switch.clone())?;
        for (host, _) in t.hosts() {
            self.add_netns(self.netns_name(&host))?;
        }
        let no_bridge_nf = [("net.bridge.bridge-nf-call-iptables", "0")];
        sys::sysctls(&netns_path(&switch), &no_bridge_nf)?;
        let mut lines = vec!["link set lo up".to_string()];
        for (i, _) in t.networks().iter().enumerate() {
            lines.push(format!("link add br{i} type bridge"));
            lines.push(format!("link set br{i} up"));
        }
        ip_batch(&switch, &lines)?;

        for (ni, node) in t.nodes.iter().enumerate() {
            self.build_node(ni, node)?;
        }
        for pod in &t.pods {
            self.pod_inside(pod)?;
        }
        for (ci, c) in t.clients.iter().enumerate() {
            if let Some(net) = &c.network {
                self.build_network_client(ci, c, net)?;
                continue;
            }
            let mut lines = vec!["link set lo up".to_string()];
            let mut default6 = false;
            for (j, a) in c.attach.iter().enumerate() {
                let (n, iface) = a.split_once('/').unwrap_or_default();
                let node = t.node(n).ok_or_else(|| anyhow!("client {}: no node {n}", c.name))?;
                let public = node.public.iter().find(|p| p.interface == iface);
                let public = public.ok_or_else(|| anyhow!("client {}: no interface {a}", c.name))?;
                let gw = public.address.addr();
                if j == 0 {
                    lines.push(format!("addr add {}/32 dev eth0", c.address));
                }
                lines.push(format!("link set eth{j} up"));
                lines.push(format!("route add {gw}/32 dev eth{j} scope link"));
                if j == 0 {
                    lines.push(format!("route add default via {gw} dev eth0"));
                }
                // IPv6: the address on every attachment that has it (neighbour discovery
                // answers only for the receiving device's own addresses), the default route by
                // the first.
                if let (Some(a6), Some(gw6)) = (c.address6, public.address6.map(|p| p.addr())) {
                    lines.push(format!("addr add {a6}/128 dev eth{j} nodad"));
                    lines.push(format!("route add {gw6}/128 dev eth{j}"));
                    if !default6 {
                        lines.push(format!("route add default via {gw6} dev eth{j}"));
                        default6 = true;
                    }
                }
            }
            ip_batch(&self.netns_name(&c.name), &lines)?;
        }
        for pod in &t.pods {
            self.start_server(pod)?;
        }
        Ok(())
    }

    /// One node: its namespace's uplink (to the switch, or to its NAT router), CNI, public
    /// interfaces with their clients' veths, pods' node-side devices and NAT; its router.
    fn build_node(&self, ni: usize, node: &NodeSpec) -> anyhow::Result<()> {
        let t = &self.topology;
        let switch = self.switch();
        let cidrs: Vec<String> = t.nodes.iter().map(|n| n.pod_cidr.0.trunc().to_string()).collect();
        let ns = self.netns_name(&node.name);
        // Forwarding first, so every device made afterwards forwards too.
        sys::sysctls(
            &netns_path(&ns),
            &[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv6.conf.all.forwarding", "1"),
                ("net.bridge.bridge-nf-call-iptables", "0"),
            ],
        )?;
        let u = &node.underlay;
        let net = t.networks().iter().position(|n| *n == u.network).unwrap_or_default();
        // A node behind NAT has its router's LAN at the other end of its uplink; any other
        // node, the switch.
        let (peer, peer_ns) = match node.router_host() {
            Some(router) => ("lan0".to_string(), self.netns_name(&router)),
            None => (format!("n{ni}"), switch.clone()),
        };
        let mut lines = vec![
            "link set lo up".to_string(),
            format!("link add name {} mtu {} type veth peer name {peer} netns {peer_ns}", u.interface, u.mtu),
            format!("addr add {} dev {}", u.address, u.interface),
            format!("link set dev {} up", u.interface),
        ];
        if let Some(a6) = u.address6 {
            lines.push(format!("addr add {a6} dev {} nodad", u.interface));
        }
        if node.nat.is_some() {
            lines.push(format!("route add default via {} dev {}", node.lan_gateway(), u.interface));
        }
        lines.extend(match t.cni {
            Cni::Cilium => cni::host_lines(node),
            Cni::Bridge => cni::bridge::host_lines(node),
            Cni::Calico => cni::calico::host_lines(node),
        });
        for p in &node.public {
            lines.push(format!("link add name {} type bridge", p.interface));
            lines.push(format!("addr add {} dev {}", p.address, p.interface));
            if let Some(a6) = p.address6 {
                lines.push(format!("addr add {a6} dev {} nodad", p.interface));
            }
            lines.push(format!("link set dev {} up", p.interface));
        }
        for (ci, c) in t.clients.iter().enumerate() {
            for (j, a) in c.attach.iter().enumerate() {
                let Some((n, iface)) = a.split_once('/') else { continue };
                if n != node.name {
                    continue;
                }
                let client_ns = self.netns_name(&c.name);
                lines.push(format!("link add lab-c{ci}-{j} type veth peer name eth{j} netns {client_ns}"));
                lines.push(format!("link set dev lab-c{ci}-{j} master {iface} up"));
                lines.push(format!("route add {}/32 dev {iface}", c.address));
                if let (Some(a6), Some(_)) = (c.address6, t.public_address6(n, iface)) {
                    lines.push(format!("route add {a6}/128 dev {iface}"));
                }
            }
        }
        for pod in t.pods.iter().filter(|p| p.node == node.name) {
            lines.extend(self.pod_lines_on_node(pod));
        }
        ip_batch(&ns, &lines)?;
        for pod in t.pods.iter().filter(|p| p.node == node.name) {
            self.pod_sysctls(pod)?;
        }
        self.sync_tc(node)?;
        sys::nft(&ns, &(cni_nat(t.cni, node, &cidrs) + &cni_nat6(t, node).unwrap_or_default()))?;
        match (&node.nat, node.router_host()) {
            (Some(nat), Some(router)) => self.build_router(ni, node, nat, &router, net)?,
            _ => {
                // The underlay port on the switch.
                ip_batch(&switch, &[format!("link set n{ni} mtu {} master br{net} up", u.mtu)])?;
            }
        }
        Ok(())
    }

    /// A node's NAT router (docs/overlay/lab.md): `lan0` to the node, with the segment's first
    /// host; `wan0` on the network's bridge, with the public address; the NAT in nftables.
    fn build_router(&self, ni: usize, node: &NodeSpec, nat: &Nat, router: &str, net: usize) -> anyhow::Result<()> {
        let ns = self.netns_name(router);
        let switch = self.switch();
        let u = &node.underlay;
        sys::sysctls(&netns_path(&ns), &[("net.ipv4.ip_forward", "1"), ("net.ipv6.conf.all.forwarding", "1")])?;
        let lan = format!("{}/{}", node.lan_gateway(), u.address.0.prefix_len());
        ip_batch(
            &ns,
            &[
                "link set lo up".to_string(),
                format!("link set lan0 mtu {} up", u.mtu),
                format!("addr add {lan} dev lan0"),
                format!("link add name wan0 mtu {} type veth peer name r{ni} netns {switch}", u.mtu),
                format!("addr add {} dev wan0", nat.public),
                "link set wan0 up".to_string(),
            ],
        )?;
        ip_batch(&switch, &[format!("link set r{ni} mtu {} master br{net} up", u.mtu)])?;
        sys::nft(&ns, &nat_ruleset(nat, node.underlay.address.addr()))?;
        Ok(())
    }

    /// A client on an underlay network: its `eth0` a port of the network's bridge, its address
    /// with the prefix of the segment it is in.
    fn build_network_client(&self, ci: usize, c: &ClientSpec, net: &str) -> anyhow::Result<()> {
        let t = &self.topology;
        let switch = self.switch();
        let index = t.networks().iter().position(|n| *n == net).ok_or_else(|| anyhow!("no network {net}"))?;
        let segment = t.segments(net).into_iter().find(|s| s.contains(&c.address));
        let len = segment.map_or(32, |s| s.prefix_len());
        let client_ns = self.netns_name(&c.name);
        let mut lines = vec![
            "link set lo up".to_string(),
            format!("addr add {}/{len} dev eth0", c.address),
            "link set eth0 up".into(),
        ];
        if let Some(a6) = c.address6 {
            let len6 = t.segments6(net).into_iter().find(|s| s.contains(&a6)).map_or(128, |s| s.prefix_len());
            lines.push(format!("addr add {a6}/{len6} dev eth0 nodad"));
        }
        ip_batch(
            &switch,
            &[
                format!("link add name c{ci} type veth peer name eth0 netns {client_ns}"),
                format!("link set c{ci} master br{index} up"),
            ],
        )?;
        ip_batch(&client_ns, &lines)
    }

    /// The node-side lines of a pod, for the topology's CNI.
    fn pod_lines_on_node(&self, pod: &PodSpec) -> Vec<String> {
        let ns = self.netns_name(&pod.name);
        let address6 = self.topology.pod_address6(pod);
        match self.topology.cni {
            Cni::Cilium => cni::pod_lines_on_node(pod, address6, &ns),
            Cni::Bridge => cni::bridge::pod_lines_on_node(pod, &ns),
            Cni::Calico => cni::calico::pod_lines_on_node(pod, address6, &ns),
        }
    }

    /// The node-side device of a pod's veth, as the topology's CNI names it.
    fn pod_device(&self, pod: &PodSpec) -> String {
        match self.topology.cni {
            Cni::Cilium => cni::lxc_name(pod),
            Cni::Bridge => cni::bridge::veth_name(pod),
            Cni::Calico => cni::calico::cali_name(pod),
        }
    }

    /// The node's settings of a pod's node-side device, once it exists (Calico's proxy ARP).
    fn pod_sysctls(&self, pod: &PodSpec) -> anyhow::Result<()> {
        if self.topology.cni != Cni::Calico {
            return Ok(());
        }
        let settings = cni::calico::sysctls(pod);
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        sys::sysctls(&netns_path(&self.netns_name(&pod.node)), &settings)
    }

    /// The pod's own namespace: its address, the router as default route.
    fn pod_inside(&self, pod: &PodSpec) -> anyhow::Result<()> {
        let node = self.topology.node(&pod.node).ok_or_else(|| anyhow!("pod {}: no node {}", pod.name, pod.node))?;
        let lines = match self.topology.cni {
            Cni::Cilium => cni::pod_lines(pod, node),
            Cni::Bridge => cni::bridge::pod_lines(pod, node),
            Cni::Calico => cni::calico::pod_lines(pod, node.pod_address6(pod)),
        };
        ip_batch(&self.netns_name(&pod.name), &lines)
    }

    /// Rewrites `cilium_host`'s egress filters: one redirect per pod on the node (Cilium only).
    fn sync_tc(&self, node: &NodeSpec) -> anyhow::Result<()> {
        if self.topology.cni != Cni::Cilium {
            return Ok(());
        }
        let ns = self.netns_name(&node.name);
        let has_qdisc = sys::run("tc", &["-n", &ns, "qdisc", "show", "dev", "cilium_host"], None)?.contains("clsact");
        let present = if has_qdisc {
            cni::tc_prios(&sys::run("tc", &["-n", &ns, "filter", "show", "dev", "cilium_host", "egress"], None)?)
        } else {
            Default::default()
        };
        // A pod's priority: its place in the topology plus one, which a move keeps.
        let pods = self
            .topology
            .pods
            .iter()
            .zip(1u32..)
            .filter(|(p, _)| p.node == node.name)
            .map(|(p, i)| (i, p, node.pod_address6(p)));
        let lines = cni::tc_lines(has_qdisc, &present, pods);
        if lines.is_empty() { Ok(()) } else { tc_batch(&ns, &lines) }
    }

    fn start_server(&mut self, pod: &PodSpec) -> anyhow::Result<()> {
        let path = netns_path(&self.netns_name(&pod.name));
        match &mut self.servers {
            Servers::InProcess { rt, pods } => {
                let rt = rt.as_ref().ok_or_else(|| anyhow!("the lab is shutting down"))?;
                pods.insert(pod.name.clone(), PodServer::start(rt.handle(), &path, &pod.name, &pod.tcp, &pod.udp)?);
            }
            Servers::Processes { bin, log_dir, pids } => {
                let pid = spawn_server(bin, log_dir, &path, pod)?;
                pids.insert(pod.name.clone(), pid);
            }
            Servers::Attached { .. } => bail!("this process did not make the lab; it cannot start servers"),
        }
        Ok(())
    }

    fn stop_server(&mut self, pod: &str) {
        match &mut self.servers {
            Servers::InProcess { pods, .. } => {
                if let Some(s) = pods.remove(pod) {
                    s.stop();
                }
            }
            Servers::Processes { pids, .. } | Servers::Attached { pids } => {
                if let Some(pid) = pids.remove(pod) {
                    kill_server(pid, &self.id);
                }
            }
        }
    }

    /// Moves a pod to another node with a new address (a rescheduled pod gets one from its new
    /// node's pod CIDR): its namespace and server are made anew. Program the lab again for
    /// kuport to follow.
    pub fn move_pod(&mut self, pod: &str, node: &str, address: Ipv4Addr) -> anyhow::Result<()> {
        let mut t = self.topology.clone();
        let p = t.pods.iter_mut().find(|p| p.name == pod).ok_or_else(|| anyhow!("no pod {pod:?}"))?;
        let old_node = std::mem::replace(&mut p.node, node.to_string());
        p.address = address;
        t.validate().map_err(|(field, reason)| anyhow!("moving pod {pod}: field {field}: {reason}"))?;
        let old = self.topology.pod(pod).cloned().ok_or_else(|| anyhow!("no pod {pod:?}"))?;
        self.stop_server(pod);
        let ns = self.netns_name(pod);
        sys::netns_del(&ns)?;
        self.namespaces.retain(|n| *n != ns);
        // As a CNI's DEL does: the node-side device goes now, not when the kernel frees the
        // namespace (later while anything still holds it), so the pod can come back here.
        let _ = ip_batch(&self.netns_name(&old_node), &[format!("link del {}", self.pod_device(&old))]);
        // The old node: the veth went with the namespace (and with it a route on it, Calico's);
        // Cilium's route and neighbour on cilium_host stay unless removed.
        if self.topology.cni == Cni::Cilium {
            let old_ns = self.netns_name(&old_node);
            let _ = ip_batch(
                &old_ns,
                &[
                    format!("route del {}/32 dev cilium_host", old.address),
                    format!("neigh del {} dev cilium_host", old.address),
                ],
            );
            if let Some(old6) = self.topology.pod_address6(&old) {
                let _ = ip_batch(
                    &old_ns,
                    &[format!("route del {old6}/128 dev cilium_host"), format!("neigh del {old6} dev cilium_host")],
                );
            }
        }
        self.topology = t;
        let old_spec = self.topology.node(&old_node).cloned().ok_or_else(|| anyhow!("no node {old_node}"))?;
        self.sync_tc(&old_spec)?;
        self.add_netns(ns)?;
        let spec = self.topology.pod(pod).cloned().ok_or_else(|| anyhow!("no pod {pod:?}"))?;
        let node_spec = self.topology.node(node).cloned().ok_or_else(|| anyhow!("no node {node}"))?;
        ip_batch(&self.netns_name(node), &self.pod_lines_on_node(&spec))?;
        self.pod_sysctls(&spec)?;
        self.sync_tc(&node_spec)?;
        self.pod_inside(&spec)?;
        self.start_server(&spec)
    }

    /// Adds a node and its pods to the running lab (its network exists already): namespaces,
    /// CNI, echo servers; every node's CNI NAT learns the new pod CIDR; with a control plane,
    /// the objects are published and the node's executor starts.
    pub fn add_node(&mut self, node: NodeSpec, pods: Vec<PodSpec>) -> anyhow::Result<()> {
        static ADDED: AtomicUsize = AtomicUsize::new(64);
        if !self.topology.networks().contains(&node.underlay.network.as_str()) {
            bail!("node {}: the lab has no network {}", node.name, node.underlay.network);
        }
        let mut t = self.topology.clone();
        t.nodes.push(node.clone());
        t.pods.extend(pods.iter().cloned());
        t.validate().map_err(|(field, reason)| anyhow!("adding node {}: field {field}: {reason}", node.name))?;
        self.topology = t;
        let mut hosts = vec![node.name.clone()];
        hosts.extend(node.router_host());
        hosts.extend(pods.iter().map(|p| p.name.clone()));
        for h in hosts {
            self.add_netns(self.netns_name(&h))?;
        }
        self.build_node(ADDED.fetch_add(1, Ordering::SeqCst), &node)?;
        for pod in &pods {
            self.pod_inside(pod)?;
            self.start_server(pod)?;
        }
        self.refresh_nat()?;
        if self.plane.is_some() {
            let objects = self.objects().to_yaml();
            let id = self.id.clone();
            let plane = self.plane.as_mut().ok_or_else(|| anyhow!("no plane"))?;
            plane.add_node(&id, &node);
            plane.set_objects(objects)?;
            plane.prepare_node(&node.name)?;
            plane.start_executor(&node.name)?;
        }
        Ok(())
    }

    /// Removes a node and its pods: its executor stops and its Node goes (with a control
    /// plane), then its processes and namespaces.
    pub fn remove_node(&mut self, name: &str) -> anyhow::Result<()> {
        let node = self.topology.node(name).cloned().ok_or_else(|| anyhow!("no node {name:?}"))?;
        if let Some(plane) = self.plane.as_mut() {
            if plane.executor_pid(name).is_some() {
                plane.kill_executor(name)?;
            }
            plane.remove_node(name);
        }
        let pods: Vec<String> = self.topology.pods.iter().filter(|p| p.node == name).map(|p| p.name.clone()).collect();
        self.topology.nodes.retain(|n| n.name != name);
        self.topology.pods.retain(|p| p.node != name);
        if self.plane.is_some() {
            self.publish()?;
        }
        for pod in &pods {
            self.stop_server(pod);
        }
        kill_inside(&self.netns_name(name));
        let mut hosts = pods;
        hosts.extend(node.router_host());
        hosts.push(name.to_string());
        for h in hosts {
            let ns = self.netns_name(&h);
            sys::netns_del(&ns)?;
            self.namespaces.retain(|n| *n != ns);
        }
        self.refresh_nat()
    }

    /// Writes every node's CNI NAT table anew for the cluster's pod CIDRs as they stand (and
    /// its IPv6 twin).
    fn refresh_nat(&self) -> anyhow::Result<()> {
        let t = &self.topology;
        let cidrs: Vec<String> = t.nodes.iter().map(|n| n.pod_cidr.0.trunc().to_string()).collect();
        let table = match t.cni {
            Cni::Cilium | Cni::Bridge => "nat",
            Cni::Calico => cni::calico::NAT_TABLE,
        };
        for node in &t.nodes {
            let ruleset = cni_nat(t.cni, node, &cidrs);
            let mut text = format!("add table ip {table}\ndelete table ip {table}\n{ruleset}");
            if let Some(six) = cni_nat6(t, node) {
                text = format!("add table ip6 nat\ndelete table ip6 nat\n{text}{six}");
            }
            sys::nft(&self.netns_name(&node.name), &text)?;
        }
        Ok(())
    }

    /// Sets a pod's endpoint condition (its server keeps running).
    pub fn set_pod_ready(&mut self, pod: &str, ready: bool) -> anyhow::Result<()> {
        let p = self.topology.pods.iter_mut().find(|p| p.name == pod).ok_or_else(|| anyhow!("no pod {pod:?}"))?;
        p.ready = ready;
        Ok(())
    }

    /// Programs the lab with kuport's real processes: writes the lab's objects and
    /// `manifests` into a manifest folder under `options.dir`, starts one controller and one
    /// executor per node ([`crate::plane`]). Returns once they started; wait for convergence
    /// with [`Plane::wait_converged`].
    pub fn start_plane(&mut self, manifests: &Manifests, options: PlaneOptions) -> anyhow::Result<&mut Plane> {
        if self.plane.is_some() {
            bail!("lab {}: the control plane runs already", self.id);
        }
        let objects = self.objects().to_yaml();
        let plane = Plane::start(&self.id, &self.topology, objects, manifests, options)?;
        Ok(self.plane.insert(plane))
    }

    /// The controller and executor processes, when started.
    pub fn plane(&self) -> Option<&Plane> {
        self.plane.as_ref()
    }

    pub fn plane_mut(&mut self) -> Option<&mut Plane> {
        self.plane.as_mut()
    }

    /// Writes the lab's objects (Nodes, EndpointSlices, ...) as the topology now stands into the
    /// plane's manifest folder: after [`Lab::move_pod`] or [`Lab::set_pod_ready`], the
    /// controller follows (the EndpointSlice's nodeName and address change).
    pub fn publish(&mut self) -> anyhow::Result<()> {
        let objects = self.objects().to_yaml();
        let plane = self.plane.as_mut().ok_or_else(|| anyhow!("lab {}: no control plane runs", self.id))?;
        plane.set_objects(objects)
    }

    /// Probes from a host with the default timeout.
    pub fn probe(&self, from: &str, to: SocketAddrV4, protocol: Protocol) -> Result<Answer, ProbeError> {
        self.probe_with(from, to, protocol, PROBE_TIMEOUT)
    }

    pub fn probe_with(
        &self,
        from: &str,
        to: SocketAddrV4,
        protocol: Protocol,
        timeout: Duration,
    ) -> Result<Answer, ProbeError> {
        let path = self.netns(from).map_err(|e| ProbeError::Io(e.to_string()))?;
        probe(&path, to, protocol, timeout)
    }

    /// Probes any address, IPv4 or IPv6 (`[2001:db8::9]:27015`), from a host with the default
    /// timeout; the answer's addresses are of the family dialed.
    pub fn probe_any(&self, from: &str, to: SocketAddr, protocol: Protocol) -> Result<Answer<SocketAddr>, ProbeError> {
        self.probe_any_with(from, to, protocol, PROBE_TIMEOUT)
    }

    pub fn probe_any_with(
        &self,
        from: &str,
        to: SocketAddr,
        protocol: Protocol,
        timeout: Duration,
    ) -> Result<Answer<SocketAddr>, ProbeError> {
        let path = self.netns(from).map_err(|e| ProbeError::Io(e.to_string()))?;
        probe_any(&path, to, protocol, timeout)
    }

    /// [`Lab::probe_any`] from source port `port`: flows that share one on purpose.
    pub fn probe_any_from(
        &self,
        from: &str,
        to: SocketAddr,
        protocol: Protocol,
        port: u16,
    ) -> Result<Answer<SocketAddr>, ProbeError> {
        let path = self.netns(from).map_err(|e| ProbeError::Io(e.to_string()))?;
        crate::probe::probe_any_from(&path, to, protocol, PROBE_TIMEOUT, port)
    }

    /// A client's address of the family of `like` (its `address6` for IPv6), when it has one.
    pub fn client_address_like(&self, client: &str, like: IpAddr) -> Option<IpAddr> {
        let c = self.topology.client(client)?;
        match like {
            IpAddr::V4(_) => Some(IpAddr::V4(c.address)),
            IpAddr::V6(_) => c.address6.map(IpAddr::V6),
        }
    }

    /// Runs `ip` inside a host's namespace; its stdout.
    pub fn ip(&self, host: &str, args: &[&str]) -> anyhow::Result<String> {
        self.netns(host)?;
        sys::ip(&self.netns_name(host), args)
    }

    /// Runs a command inside a host's namespace; its stdout.
    pub fn exec(&self, host: &str, cmd: &[&str]) -> anyhow::Result<String> {
        self.netns(host)?;
        let ns = self.netns_name(host);
        let mut args = vec!["netns", "exec", ns.as_str()];
        args.extend_from_slice(cmd);
        sys::run("ip", &args, None)
    }

    /// What another process needs to attach to this lab or tear it down.
    pub fn record(&self) -> Record {
        let servers = match &self.servers {
            Servers::Processes { pids, .. } | Servers::Attached { pids } => pids.clone(),
            Servers::InProcess { .. } => BTreeMap::new(),
        };
        Record {
            id: self.id.clone(),
            topology: self.topology.clone(),
            namespaces: self.namespaces.clone(),
            servers,
            classes: self.classes.clone(),
            plane: self.plane.as_ref().map(Plane::record),
        }
    }

    /// A lab another process made (it is not torn down on drop). Its control plane, if any, is
    /// attached by pid; `bin` is what would start its processes again.
    pub fn attach(record: Record) -> Lab {
        let plane = record.plane.as_ref().and_then(|p| {
            let bin = std::env::current_exe().unwrap_or_default();
            Plane::attach(&record.id, &record.topology, generate(&record.topology).to_yaml(), p, bin).ok()
        });
        Lab {
            id: record.id,
            topology: record.topology,
            namespaces: record.namespaces,
            armed: false,
            servers: Servers::Attached { pids: record.servers },
            executors: BTreeMap::new(),
            classes: record.classes,
            plane,
        }
    }

    /// Leaves everything in place when this handle goes (`kuport-lab up`).
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    /// Echo server processes by pod (empty for in-process servers).
    pub fn server_pids(&self) -> BTreeMap<String, u32> {
        self.record().servers
    }

    /// Stops the servers and removes every namespace; the first error, after trying all.
    pub fn teardown(mut self) -> anyhow::Result<()> {
        self.armed = false;
        self.teardown_inner()
    }

    fn teardown_inner(&mut self) -> anyhow::Result<()> {
        // The executors first: they would repair what the teardown removes, and each holds its
        // node's namespace open.
        if let Some(mut plane) = self.plane.take() {
            plane.stop();
        }
        let pods: Vec<String> = match &self.servers {
            Servers::InProcess { pods, .. } => pods.keys().cloned().collect(),
            Servers::Processes { pids, .. } | Servers::Attached { pids } => pids.keys().cloned().collect(),
        };
        for pod in pods {
            self.stop_server(&pod);
        }
        if let Servers::InProcess { rt, .. } = &mut self.servers
            && let Some(rt) = rt.take()
        {
            rt.shutdown_timeout(Duration::from_millis(500));
        }
        self.executors.clear();
        // WireGuard's userspace daemons outlive their executors (docs/overlay/node.md) and hold
        // their node's namespace: they end with it.
        if self.topology.overlay {
            for node in &self.topology.nodes {
                kill_inside(&self.netns_name(&node.name));
            }
        }
        let mut first = None;
        // Pods and clients first, then nodes, then the switch: the reverse of creation.
        for ns in self.namespaces.drain(..).rev() {
            if let Err(e) = sys::netns_del(&ns) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = self.teardown_inner()
        {
            eprintln!("lab {}: teardown: {e:#}", self.id);
        }
    }
}

/// Starts `BIN serve` for a pod, detached (own session), and waits until it serves.
fn spawn_server(bin: &Path, log_dir: &Path, netns: &Path, pod: &PodSpec) -> anyhow::Result<u32> {
    std::fs::create_dir_all(log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    let log_path = log_dir.join(format!("serve-{}.log", pod.name));
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let list = |p: &[Ports]| p.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(bin);
    cmd.arg("serve").arg("--netns").arg(netns).arg("--pod").arg(&pod.name);
    if !pod.tcp.is_empty() {
        cmd.arg("--tcp").arg(list(&pod.tcp));
    }
    if !pod.udp.is_empty() {
        cmd.arg("--udp").arg(list(&pod.udp));
    }
    let (mut proc, line) =
        spawn(cmd, log, Lifetime::Detached, true).with_context(|| format!("starting {} serve", bin.display()))?;
    if line.as_deref().map(str::trim) != Some("ready") {
        if let Some(child) = proc.child.as_mut() {
            let _ = child.wait();
        }
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        bail!("the echo server of pod {} did not start: {}", pod.name, log.trim());
    }
    Ok(proc.pid)
}

/// Kills an echo server process, only if it still is one of this lab's, and waits (briefly)
/// until it has exited.
fn kill_server(pid: u32, lab_id: &str) {
    if !owned(pid, &[" serve ", &format!("{lab_id}-")]) {
        return;
    }
    signal(pid, Signal::TERM);
    wait_gone(pid, Duration::from_secs(2));
}

/// The CNI's NAT ruleset on `node`, for the cluster's pod CIDRs `cidrs`.
fn cni_nat(cni: Cni, node: &NodeSpec, cidrs: &[String]) -> String {
    match cni {
        Cni::Cilium => cni::nat_ruleset(node, cidrs),
        Cni::Bridge => cni::bridge::nat_ruleset(node, cidrs),
        Cni::Calico => cni::calico::nat_ruleset(cidrs),
    }
}

/// The IPv6 twin of the CNI's NAT ruleset on `node`, for the cluster's IPv6 pod prefixes: None
/// for Calico (see [`crate::cni`]) and on a node without an IPv6 pod prefix.
fn cni_nat6(t: &Topology, node: &NodeSpec) -> Option<String> {
    let cidrs6: Vec<String> = t.nodes.iter().filter_map(|n| n.pod_cidr6.map(|c| c.0.trunc().to_string())).collect();
    match t.cni {
        Cni::Cilium => cni::nat6_ruleset(node, &cidrs6),
        Cni::Bridge => cni::bridge::nat6_ruleset(node, &cidrs6),
        Cni::Calico => None,
    }
}

/// A NAT router's ruleset: the LAN masqueraded out of `wan0`, or `node` mapped one to one onto
/// the public address.
fn nat_ruleset(nat: &Nat, node: Ipv4Addr) -> String {
    let public = nat.public.addr();
    let rules = match nat.kind {
        NatKind::Masquerade => "\t\toifname \"wan0\" counter masquerade\n".to_string(),
        NatKind::Symmetric => "\t\toifname \"wan0\" counter masquerade random\n".to_string(),
        NatKind::OneToOne => {
            format!("\t\toifname \"wan0\" ip saddr {node} counter snat ip to {public}\n")
        }
    };
    let pre = match nat.kind {
        NatKind::Masquerade | NatKind::Symmetric => String::new(),
        NatKind::OneToOne => format!(
            "\tchain pre {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tiifname \"wan0\" ip daddr {public} counter dnat ip to {node}\n\t}}\n"
        ),
    };
    format!(
        "table ip lab_nat {{\n{pre}\tchain post {{\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n{rules}\t}}\n}}\n"
    )
}

/// Ends every process inside namespace `ns` (SIGKILL, then a short wait): only the lab starts
/// processes in its namespaces.
fn kill_inside(ns: &str) {
    let Ok(out) = sys::run("ip", &["netns", "pids", ns], None) else { return };
    let pids: Vec<u32> = out.split_whitespace().filter_map(|p| p.parse().ok()).collect();
    for pid in &pids {
        signal(*pid, Signal::KILL);
    }
    for pid in pids {
        wait_gone(pid, Duration::from_secs(2));
    }
}
