#!/bin/sh
# Start one broker node of a Kubernetes StatefulSet (installed in the image as
# dledger-statefulset-broker; deploy/k8s/group-*.yaml run it).
#
# A StatefulSet names its pods <statefulset>-<ordinal> and, through its headless Service, gives
# each a stable DNS name <pod>.<service>.<namespace>.svc.<cluster domain> that follows the pod
# to whichever machine it runs on. This script turns that into the broker's options: the node
# id is n<ordinal>, and --peers lists n0..n<replicas-1> at their stable names, the same list on
# every pod. The peer and admin listeners bind the pod's own stable name (the kubelet writes it
# into the pod's /etc/hosts), so the admin address a node registers is one that the NameServer
# can reach; the client and gRPC listeners bind every interface, and --advertise tells clients
# the stable name.
#
# Environment (set by the StatefulSet):
#   DLEDGER_GROUP          the broker group (required)
#   DLEDGER_PEER_SERVICE   the headless Service, the StatefulSet's serviceName (required)
#   DLEDGER_NAMESRV        NameServers to register with, as for --namesrv (required)
#   POD_NAMESPACE          the pod's namespace, from the downward API (required)
#   DLEDGER_REPLICAS       members of the group: the StatefulSet's replicas (default 3)
#   DLEDGER_CLUSTER_DOMAIN the cluster's DNS domain (default cluster.local)
#   DLEDGER_PEER_PORT, DLEDGER_CLIENT_PORT, DLEDGER_ADMIN_PORT, DLEDGER_GRPC_PORT
#                          ports (defaults 20911, 10911, 8080, 8081)
#   DLEDGER_DATA_DIR       the node's data directory (default /data/node, on the pod's volume)
#   POD_NAME               the pod's name, from the downward API (default: $HOSTNAME, which
#                          the container runtime sets to it)
# Arguments are passed on to `dledger-broker start` (for example --flush-mode async).
set -eu

fail() {
    echo "dledger-statefulset-broker: $*" >&2
    exit 2
}

group=${DLEDGER_GROUP:-}
service=${DLEDGER_PEER_SERVICE:-}
namesrv=${DLEDGER_NAMESRV:-}
namespace=${POD_NAMESPACE:-}
replicas=${DLEDGER_REPLICAS:-3}
domain=${DLEDGER_CLUSTER_DOMAIN:-cluster.local}
peer_port=${DLEDGER_PEER_PORT:-20911}
client_port=${DLEDGER_CLIENT_PORT:-10911}
admin_port=${DLEDGER_ADMIN_PORT:-8080}
grpc_port=${DLEDGER_GRPC_PORT:-8081}
data_dir=${DLEDGER_DATA_DIR:-/data/node}
pod=${POD_NAME:-${HOSTNAME:-}}

[ -n "$group" ] || fail "DLEDGER_GROUP is not set"
[ -n "$service" ] || fail "DLEDGER_PEER_SERVICE is not set"
[ -n "$namesrv" ] || fail "DLEDGER_NAMESRV is not set"
[ -n "$namespace" ] || fail "POD_NAMESPACE is not set"
[ -n "$pod" ] || fail "neither POD_NAME nor HOSTNAME is set"
case $replicas in
    '' | *[!0-9]*) fail "DLEDGER_REPLICAS must be a number, not '$replicas'" ;;
esac
[ "$replicas" -ge 1 ] || fail "DLEDGER_REPLICAS must be at least 1"

# <statefulset>-<ordinal>: the ordinal is what follows the last '-'
ordinal=${pod##*-}
statefulset=${pod%-*}
case $ordinal in
    '' | *[!0-9]*) fail "pod name '$pod' does not end in -<ordinal>: not a StatefulSet pod" ;;
esac
[ "$statefulset" != "$pod" ] || fail "pod name '$pod' does not end in -<ordinal>"
[ "$ordinal" -lt "$replicas" ] || fail "pod '$pod' has ordinal $ordinal, but the group has \
$replicas members (DLEDGER_REPLICAS): add members with 'dledger group add-node' and --join"

suffix=$service.$namespace.svc.$domain
self=$pod.$suffix
peers=
i=0
while [ "$i" -lt "$replicas" ]; do
    peers="$peers${peers:+,}n$i=$statefulset-$i.$suffix:$peer_port"
    i=$((i + 1))
done

exec dledger-broker start \
    --group "$group" --id "n$ordinal" --peers "$peers" \
    --data-dir "$data_dir" \
    --listen "0.0.0.0:$client_port" --advertise "$self:$client_port" \
    --admin-listen "$self:$admin_port" \
    --grpc-listen "0.0.0.0:$grpc_port" \
    --namesrv "$namesrv" \
    "$@"
