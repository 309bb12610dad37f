//! Sysctls, read and written through /proc/sys from the thread that is inside the namespace,
//! one per key. kuport sets them and never reverts them: other software may depend on them too.
//!
//! /proc/sys/net resolves against the network namespace of the task that opens the file (not the
//! one that mounted /proc), so a thread that has setns()'d sees and sets its namespace's values;
//! the root tests check this against `ip netns exec ... sysctl`.

use std::{collections::BTreeMap, path::PathBuf};

use crate::rtnl::{Change, Difference, Error, SysctlSpec};

const PROC_SYS: &str = "/proc/sys";

/// The /proc/sys path of `key` (`net.ipv4.ip_forward` or `net/ipv4/conf/eth0.100/rp_filter`, the
/// slash form allowing dots inside a component, as sysctl(8) does). None if it could escape.
pub(crate) fn key_path(key: &str) -> Option<PathBuf> {
    let parts: Vec<&str> = if key.contains('/') { key.split('/').collect() } else { key.split('.').collect() };
    if parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
        return None;
    }
    let mut path = PathBuf::from(PROC_SYS);
    path.extend(parts);
    Some(path)
}

/// Whether two sysctl values are the same: the kernel separates multi-value sysctls by tabs and
/// ends with a newline, where a desired state may use spaces.
fn same_value(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

/// The current value of `key` in the calling thread's namespace.
pub(crate) fn read(key: &str) -> Result<String, Error> {
    let path = key_path(key)
        .ok_or_else(|| Error::Invalid { object: format!("sysctl {key}"), reason: "not a sysctl key".into() })?;
    std::fs::read_to_string(path)
        .map(|v| v.trim_end().to_string())
        .map_err(|source| Error::Sysctl { key: key.to_string(), source })
}

/// Sets `spec` if it does not hold yet; true if it wrote.
pub(crate) fn ensure(spec: &SysctlSpec) -> Result<bool, Error> {
    if same_value(&read(&spec.key)?, &spec.value) {
        return Ok(false);
    }
    let path = key_path(&spec.key)
        .ok_or_else(|| Error::Invalid { object: spec.to_string(), reason: "not a sysctl key".into() })?;
    std::fs::write(path, format!("{}\n", spec.value))
        .map_err(|source| Error::Sysctl { key: spec.key.clone(), source })?;
    Ok(true)
}

/// Values of the desired sysctls; one that does not exist (yet: a per-link key before its link)
/// is left out, which [`plan`] reports as missing.
pub(crate) fn read_all(desired: &[SysctlSpec]) -> Result<BTreeMap<String, String>, Error> {
    let mut values = BTreeMap::new();
    for s in desired {
        match read(&s.key) {
            Ok(v) => {
                values.insert(s.key.clone(), v);
            }
            Err(Error::Sysctl { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(values)
}

/// The sysctls to set: each desired one whose value differs, with the value it has.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub sets: Vec<(SysctlSpec, Option<String>)>,
}

pub(crate) fn plan(desired: &[SysctlSpec], values: &BTreeMap<String, String>) -> Plan {
    let sets = desired
        .iter()
        .filter_map(|s| {
            let current = values.get(&s.key);
            let same = current.is_some_and(|c| same_value(c, &s.value));
            (!same).then(|| (s.clone(), current.cloned()))
        })
        .collect();
    Plan { sets }
}

impl Plan {
    pub(crate) fn missing(&self, out: &mut Vec<Difference>) {
        for (s, current) in &self.sets {
            let change = match current {
                Some(v) => Change::Changed(format!("{v} -> {}", s.value)),
                None => Change::Missing,
            };
            out.push(Difference { object: s.to_string(), change });
        }
    }
}

/// Sets `spec`; the action to report.
pub(crate) fn set(spec: &SysctlSpec) -> Result<String, Error> {
    ensure(spec).map(|_| format!("set {spec} = {}", spec.value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_forms() {
        assert_eq!(key_path("net.ipv4.ip_forward"), Some(PathBuf::from("/proc/sys/net/ipv4/ip_forward")));
        assert_eq!(
            key_path("net/ipv4/conf/eth0.100/rp_filter"),
            Some(PathBuf::from("/proc/sys/net/ipv4/conf/eth0.100/rp_filter"))
        );
        assert_eq!(key_path("net..x"), None);
        assert_eq!(key_path("net/../../etc"), None);
        assert_eq!(key_path(""), None);
    }

    #[test]
    fn values_compare_by_words() {
        assert!(same_value("4096\t87380\t6291456", "4096 87380 6291456"));
        assert!(same_value("1", "1"));
        assert!(!same_value("1", "0"));
    }
}
