#!/usr/bin/env bash
# Start or stop a Spark standalone master and one worker from the pyspark installation.
#   deploy/standalone-cluster.sh start|stop|status
# Settings (environment): XSG_PYTHON (python with pyspark; default .venv/bin/python),
#   XSG_SPARK_HOST (127.0.0.1), XSG_MASTER_PORT (7077), XSG_MASTER_UI_PORT (8080),
#   XSG_WORKER_UI_PORT (8081), XSG_WORKER_CORES (1), XSG_WORKER_MEMORY (1g),
#   XSG_CLUSTER_DIR (data/spark-standalone: logs, pid files, worker scratch space).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${XSG_PYTHON:-$here/.venv/bin/python}
host=${XSG_SPARK_HOST:-127.0.0.1}
port=${XSG_MASTER_PORT:-7077}
master_ui=${XSG_MASTER_UI_PORT:-8080}
worker_ui=${XSG_WORKER_UI_PORT:-8081}
cores=${XSG_WORKER_CORES:-1}
memory=${XSG_WORKER_MEMORY:-1g}
dir=${XSG_CLUSTER_DIR:-$here/data/spark-standalone}
spark_home=$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
spark_class="$spark_home/bin/spark-class"
url="spark://$host:$port"

start_one() {  # name, then the spark-class arguments
  local name=$1; shift
  if [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
    echo "$name already running (pid $(cat "$dir/$name.pid"))"; return
  fi
  SPARK_HOME="$spark_home" SPARK_LOCAL_IP="$host" SPARK_WORKER_DIR="$dir/work" \
    nohup "$spark_class" "$@" >"$dir/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
  echo "$name started (pid $!, log $dir/$name.log)"
}

wait_for() {  # file, pattern, what
  for _ in $(seq 1 120); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  echo "timed out waiting for $3; see $1" >&2; return 1
}

case "${1:-}" in
  start)
    "$here/deploy/check_java.sh"
    mkdir -p "$dir/work"
    start_one master org.apache.spark.deploy.master.Master \
      --host "$host" --port "$port" --webui-port "$master_ui"
    wait_for "$dir/master.log" "I have been elected leader" "the master"
    start_one worker org.apache.spark.deploy.worker.Worker "$url" \
      --host "$host" --cores "$cores" --memory "$memory" --webui-port "$worker_ui" \
      --work-dir "$dir/work"
    wait_for "$dir/worker.log" "Successfully registered with master" "the worker"
    echo "cluster up: $url  (gateway: xsg serve --spark-master $url)"
    ;;
  stop)
    for name in worker master; do
      if [ -f "$dir/$name.pid" ]; then
        pid=$(cat "$dir/$name.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/$name.pid"
        echo "$name stopped"
      fi
    done
    ;;
  status)
    for name in master worker; do
      if [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
        echo "$name running (pid $(cat "$dir/$name.pid"))"
      else
        echo "$name not running"
      fi
    done
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
