# Sourced by e2e/chart/test.sh and rbac.sh (which define `log` and `work` first): the lab's helm,
# kubectl, kube-apiserver and etcd, cached in ${KUPORT_CACHE:-~/.cache/kuport}/bin (instant when
# present, else built, ~30 min), and Helm's config, cache and data kept out of the user's home.
bin=$(e2e/controlplane/build.sh helm kubectl kube-apiserver etcd | tail -n1)
for b in helm kubectl kube-apiserver etcd; do
  [ -x "$bin/$b" ] || { log "missing $bin/$b after build.sh"; exit 1; }
done
helm() { "$bin/helm" "$@"; }
kubectl() { "$bin/kubectl" "$@"; }
export HELM_CONFIG_HOME="$work/helm/config" HELM_CACHE_HOME="$work/helm/cache" HELM_DATA_HOME="$work/helm/data"
