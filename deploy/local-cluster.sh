#!/usr/bin/env bash
# One gateway of several processes on this machine, as one command: PostgreSQL (Debian's server,
# initdb/pg_ctl in a data folder), a Spark standalone master and worker
# (deploy/standalone-cluster.sh), N `xsg serve --cluster` processes sharing that store and one
# data directory, and the caching proxy in front of them; with XSG_EDGES, also a Kafka broker
# and that many edges (`xsg edge`): the processes deliver through plan topics and the proxy
# relays reads from the edges. Ctrl-C (or SIGTERM) stops everything, in the reverse order; the
# data stays for the next start.
#   deploy/local-cluster.sh            (or: make cluster)
# Settings (environment):
#   XSG_PROCESSES (2)        gateway processes
#   XSG_PORT (8080)          the proxy's port: the gateway's address for clients
#   XSG_FIRST_PORT (8091)    the processes listen on this port and the next ones
#   XSG_PG_PORT (55432)      PostgreSQL's port (127.0.0.1 only)
#   XSG_LEASE_SECONDS (5)    a dead process's streams move after about this long
#   XSG_LOCAL_CLUSTER_DIR (data/local-cluster): postgres/, spark/, data/ (the gateway's shared
#                            data directory), logs/
#   XSG_SPARK_MASTER         use this Spark master instead of starting one (e.g. local[2])
#   XSG_EDGES (0)            edges: delivery = "kafka" (docs/operate/edges.md), a Kafka broker
#                            (KRaft, the one `make kafka` runs) started here, SCRAM users and
#                            ACLs for the processes and each edge (python -m pep.delivery.grants)
#   XSG_FIRST_EDGE_PORT (8191) the edges listen on this port and the next ones
#   XSG_KAFKA_PORT (19092)   the broker's administrators' listener; its controller on the next
#                            port, SASL/SCRAM (what the processes and edges use) on the one after
#   XSG_PYTHON (.venv/bin/python), and deploy/standalone-cluster.sh's own settings.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${XSG_PYTHON:-$here/.venv/bin/python}
processes=${XSG_PROCESSES:-2}
proxy_port=${XSG_PORT:-8080}
first_port=${XSG_FIRST_PORT:-8091}
pg_port=${XSG_PG_PORT:-55432}
lease=${XSG_LEASE_SECONDS:-5}
edges=${XSG_EDGES:-0}
first_edge_port=${XSG_FIRST_EDGE_PORT:-8191}
kafka_port=${XSG_KAFKA_PORT:-19092}
dir=${XSG_LOCAL_CLUSTER_DIR:-$here/data/local-cluster}
mkdir -p "$dir/logs" "$dir/data"
dir=$(cd "$dir" && pwd)
logs=$dir/logs
store="postgresql://xsg@127.0.0.1:$pg_port/xsg"
pids=()
kafka_pid=""
started_spark=0
started_pg=0

say() { echo "local-cluster: $*"; }

# wait_line FILE PATTERN PID [SECONDS]: until a line of FILE matches PATTERN (grep) - the ready
# line a process prints once it serves; fails, saying why on stderr, when process PID stopped
# first or after SECONDS (300)
wait_line() {
  local file=$1 pattern=$2 pid=$3 tries=$((${4:-300} * 2))
  for _ in $(seq 1 "$tries"); do
    grep -q "$pattern" "$file" 2>/dev/null && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "local-cluster: process $pid stopped before it was ready" >&2; return 1
    fi
    sleep 0.5
  done
  echo "local-cluster: no line '$pattern' in $file after ${4:-300} s" >&2
  return 1
}

# -- PostgreSQL --------------------------------------------------------------------------------
pg_bin=""
for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
  if [ -x "$candidate/initdb" ] && [ -x "$candidate/pg_ctl" ]; then pg_bin=$candidate; break; fi
done
if [ -z "$pg_bin" ] && command -v initdb >/dev/null 2>&1; then
  pg_bin=$(dirname "$(command -v initdb)")
fi
if [ -z "$pg_bin" ]; then
  echo "local-cluster: no PostgreSQL server binaries (initdb, pg_ctl); run 'make postgresql'" \
       "(installs Debian's postgresql with apt-get) or install them" >&2
  exit 2
fi
as_pg=()  # PostgreSQL will not run as root: then as the postgres user (the Debian package's)
pg_user=""
if [ "$(id -u)" = 0 ]; then
  pg_user=postgres
  id postgres >/dev/null 2>&1 || pg_user=nobody
  as_pg=(runuser -u "$pg_user" --)
fi
pg_data=$dir/postgres

stop_all() {  # $1: the exit status
  local status=${1:-0}
  trap - INT TERM EXIT
  say "stopping"
  if [ ${#pids[@]} -gt 0 ]; then
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
      for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL "$pid" 2>/dev/null || true
    done
  fi
  if [ -n "$kafka_pid" ]; then  # after the processes and edges: their last writes land
    kill -TERM "$kafka_pid" 2>/dev/null || true
    for _ in $(seq 1 120); do kill -0 "$kafka_pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$kafka_pid" 2>/dev/null || true
    say "Kafka stopped"
  fi
  if [ "$started_spark" = 1 ]; then
    XSG_CLUSTER_DIR="$dir/spark" "$here/deploy/standalone-cluster.sh" stop || true
  fi
  if [ "$started_pg" = 1 ]; then
    "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_data" -m fast -w stop >/dev/null || true
    say "PostgreSQL stopped"
  fi
  say "stopped (data kept in $dir)"
  exit "$status"
}
trap 'stop_all 0' INT TERM
trap 'stop_all $?' EXIT

if [ ! -f "$pg_data/PG_VERSION" ]; then
  mkdir -p "$pg_data"
  if [ -n "$pg_user" ]; then chown "$pg_user" "$pg_data"; fi
  "${as_pg[@]}" "$pg_bin/initdb" -D "$pg_data" -U xsg --auth=trust -E UTF8 >"$logs/initdb.log"
  say "PostgreSQL data folder made: $pg_data"
fi
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_data" -l "$pg_data/server.log" -w -t 60 \
  -o "-p $pg_port -k $pg_data -c listen_addresses=127.0.0.1 -c max_connections=200" start \
  >/dev/null
started_pg=1
if ! "$python" - "$store" <<'EOF'
import sys, psycopg
url = sys.argv[1]
with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
    if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'xsg'").fetchone() is None:
        conn.execute("CREATE DATABASE xsg")
EOF
then echo "local-cluster: could not create the database xsg" >&2; exit 1; fi
say "PostgreSQL on 127.0.0.1:$pg_port (data and log in $pg_data)"

# -- Spark -------------------------------------------------------------------------------------
master=${XSG_SPARK_MASTER:-}
spark_conf=()
if [ -z "$master" ]; then
  XSG_CLUSTER_DIR="$dir/spark" XSG_WORKER_CORES=${XSG_WORKER_CORES:-$processes} \
    XSG_WORKER_MEMORY=${XSG_WORKER_MEMORY:-$((processes))g} \
    XSG_MASTER_UI_PORT=${XSG_MASTER_UI_PORT:-18080} \
    XSG_WORKER_UI_PORT=${XSG_WORKER_UI_PORT:-18081} \
    "$here/deploy/standalone-cluster.sh" start
  started_spark=1
  master="spark://${XSG_SPARK_HOST:-127.0.0.1}:${XSG_MASTER_PORT:-7077}"
  # each process is one Spark application: a core of the worker each, not all of them
  spark_conf=(--conf spark.cores.max=1 --conf spark.executor.memory=512m)
fi

# -- Kafka and the edges' identities (XSG_EDGES) -----------------------------------------------
delivery_env=()
if [ "$edges" -gt 0 ]; then
  "$python" -u -m tests.kafka.broker --port "$kafka_port" --data-dir "$dir/kafka" \
    >"$logs/kafka.out" 2>"$logs/kafka.err" &
  kafka_pid=$!
  wait_line "$logs/kafka.out" "^Kafka .* on " "$kafka_pid" 120 || {
    echo "local-cluster: Kafka did not start; see $logs/kafka.err" >&2; exit 1; }
  sasl_port=$((kafka_port + 2))
  # one SCRAM password per Kafka user, made at the first start and kept (mode 600)
  secrets_file=$dir/kafka-users.env
  if [ ! -f "$secrets_file" ]; then
    (umask 077; : >"$secrets_file")
  fi
  users=(xsg-gateway)
  for k in $(seq 1 "$edges"); do users+=("edge-$k"); done
  for user in "${users[@]}"; do
    var=XSG_DELIVERY_PASSWORD_$(echo "$user" | tr 'a-z.-' 'A-Z__')
    grep -q "^$var=" "$secrets_file" || \
      echo "$var=$("$python" -c 'import secrets; print(secrets.token_urlsafe(24))')" \
        >>"$secrets_file"
  done
  set -a; . "$secrets_file"; set +a
  edge_flags=()
  for k in $(seq 1 "$edges"); do edge_flags+=(--edge "edge-$k"); done
  "$python" -m pep.delivery.grants --bootstrap "127.0.0.1:$kafka_port" --gateway xsg-gateway \
    "${edge_flags[@]}" >"$logs/grants.log" 2>&1 || {
      echo "local-cluster: could not grant the Kafka users; see $logs/grants.log" >&2; exit 1; }
  delivery_env=(XSG_DELIVERY=kafka XSG_DELIVERY_BROKERS="127.0.0.1:$sasl_port"
                XSG_DELIVERY_SECURITY_PROTOCOL=SASL_PLAINTEXT
                XSG_DELIVERY_USERNAME=xsg-gateway
                XSG_DELIVERY_PASSWORD="$XSG_DELIVERY_PASSWORD_XSG_GATEWAY")
  say "Kafka on 127.0.0.1:$kafka_port (SASL/SCRAM on $sasl_port; log $logs/kafka.err); users" \
      "in $secrets_file"
fi

# -- the gateway's processes -------------------------------------------------------------------
# the proxy's feed token and webhook key, shared by the processes' hubs and the proxy (the same
# XSG_PROXY_* names): made once, kept (mode 600); without them the proxy cannot cache
proxy_secrets=$dir/proxy.env
if [ ! -f "$proxy_secrets" ]; then
  (umask 077
   echo "XSG_PROXY_TOKEN=$("$python" -c 'import secrets; print(secrets.token_urlsafe(32))')" \
     >"$proxy_secrets"
   echo "XSG_PROXY_SECRET=$("$python" -c 'import secrets; print(secrets.token_urlsafe(32))')" \
     >>"$proxy_secrets")
fi
set -a; . "$proxy_secrets"; set +a
# the demo tokens, made once before the processes start (they share the data directory)
"$python" - "$dir/data" <<'EOF'
import sys
from pathlib import Path
from pep.config import GatewayConfig
from pep.config.demo import ensure_demo_auth_file
ensure_demo_auth_file(GatewayConfig(data_dir=Path(sys.argv[1]), policies_dir=None))
EOF
upstreams=()
for n in $(seq 0 $((processes - 1))); do
  port=$((first_port + n))
  env "${delivery_env[@]}" XSG_STORE="$store" PYSPARK_PYTHON="$python" \
    "$python" -u -m pep.cli serve --cluster \
    --port "$port" --data-dir "$dir/data" --spark-master "$master" \
    --lease-seconds "$lease" --base-url "http://127.0.0.1:$proxy_port" "${spark_conf[@]}" \
    >"$logs/gateway-$n.out" 2>"$logs/gateway-$n.err" &
  pids+=($!)
  upstreams+=("http://127.0.0.1:$port")
  say "gateway process $n starting on 127.0.0.1:$port (log $logs/gateway-$n.err)"
done
for n in $(seq 0 $((processes - 1))); do
  wait_line "$logs/gateway-$n.out" "^xsg gateway listening on" "${pids[$n]}" 300 || {
    echo "local-cluster: gateway process $n did not start; see $logs/gateway-$n.err" >&2
    exit 1; }
done
say "gateway processes up: ${upstreams[*]}"

# -- the edges ---------------------------------------------------------------------------------
edge_urls=()
if [ "$edges" -gt 0 ]; then
  first_edge_pid=${#pids[@]}
  for k in $(seq 1 "$edges"); do
    port=$((first_edge_port + k - 1))
    var=XSG_DELIVERY_PASSWORD_EDGE_$k
    env "${delivery_env[@]}" XSG_STORE="$store" XSG_DELIVERY_PASSWORD="${!var}" \
      "$python" -u -m pep.cli edge --port "$port" --id "edge-$k" --username "edge-$k" \
      --auth "$dir/data/auth.json" >"$logs/edge-$k.out" 2>"$logs/edge-$k.err" &
    pids+=($!)
    edge_urls+=("http://127.0.0.1:$port")
  done
  for k in $(seq 1 "$edges"); do
    wait_line "$logs/edge-$k.out" "^xsg edge edge-$k on " "${pids[$((first_edge_pid + k - 1))]}" \
      120 || { echo "local-cluster: edge $k did not start; see $logs/edge-$k.err" >&2; exit 1; }
  done
  say "edges up: ${edge_urls[*]}"
fi

# -- the proxy ---------------------------------------------------------------------------------
joined=$(IFS=,; echo "${upstreams[*]}")
proxy_edges=()
if [ "$edges" -gt 0 ]; then proxy_edges=(--edges "$(IFS=,; echo "${edge_urls[*]}")"); fi
"$python" -u -m proxy --upstream "$joined" --port "$proxy_port" "${proxy_edges[@]}" \
  >"$logs/proxy.out" 2>"$logs/proxy.err" &
pids+=($!)
for _ in $(seq 1 120); do
  "$python" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$proxy_port/proxy/health', timeout=2)" \
    2>/dev/null && break
  sleep 0.5
done

echo
echo "xsg gateway of $processes processes: http://127.0.0.1:$proxy_port (through the proxy)"
echo "  store     $store   data $dir/data   Spark $master"
echo "  processes ${upstreams[*]}   (GET /cluster: who serves which stream)"
if [ "$edges" -gt 0 ]; then
  echo "  edges     ${edge_urls[*]}   (handle reads, through the proxy; Kafka 127.0.0.1:$kafka_port)"
fi
echo "  demo tokens: $dir/data/auth.json"
"$python" - "$dir/data/auth.json" <<'EOF'
import json, sys
for e in json.load(open(sys.argv[1])):
    print(f"    {e['subject']:<6} {e['token']}" + ("  (administrator)" if e.get("admin") else ""))
EOF
echo "  export XSG_URL=http://127.0.0.1:$proxy_port"
echo "  Ctrl-C stops everything."
while true; do
  for n in "${!pids[@]}"; do
    if ! kill -0 "${pids[$n]}" 2>/dev/null; then
      say "process ${pids[$n]} has stopped (kept running: the others serve its streams)"
      unset "pids[$n]"
    fi
  done
  sleep 2
done
