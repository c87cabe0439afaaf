#!/usr/bin/env bash
# Fetch what Kafka streams need from Maven Central into the checkout's cache (.cache/kafka/,
# git-ignored), once:
#   .cache/kafka/spark-<pyspark version>/  Spark's Kafka connector for the installed pyspark and
#                                          the runtime jars it needs that the pyspark wheel lacks
#                                          (the gateway's SparkSession puts them on spark.jars)
#   .cache/kafka/broker-<kafka version>/   a Kafka broker and its console tools, with every
#                                          runtime dependency (tests, `make kafka`)
# A directory is complete when its `.complete` marker exists: a second run does nothing (and
# asks no network). Without `mvn` it says what to install and exits 0: Kafka streams then fail
# with a message saying so, and the Kafka tests skip with the same reason.
#
# usage: deploy/fetch_kafka_jars.sh [PYTHON]   (the Python whose pyspark is used; .venv's)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${1:-$root/.venv/bin/python}
cache=${XSG_KAFKA_CACHE:-$root/.cache/kafka}
# (without importing pyspark, which takes most of a second)
read -r spark_version spark_jars < <("$py" -c 'import importlib.metadata as m, importlib.util as u, os
print(m.version("pyspark"), os.path.join(u.find_spec("pyspark").submodule_search_locations[0], "jars"))')
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$root/deploy/kafka/broker.pom.xml")
connector=$cache/spark-$spark_version
broker=$cache/broker-$kafka_version

if [ -f "$connector/.complete" ] && [ -f "$broker/.complete" ]; then
  exit 0
fi
mkdir -p "$cache"
if ! command -v mvn >/dev/null 2>&1; then
  msg="no 'mvn' found: Spark's Kafka connector and the test broker are fetched from Maven Central with it (Debian/Ubuntu: apt-get install maven)"
  echo "xsg: $msg; Kafka streams cannot run and the Kafka tests will skip" >&2
  echo "$msg" > "$cache/unavailable.txt"
  exit 0
fi
rm -f "$cache/unavailable.txt"

# Artifact name of a jar file: its name without "-<version>.jar".
artifact() { basename "$1" | sed 's/-[0-9][^-]*\.jar$//'; }

# copy POM DEST [PROPERTY=VALUE]: the POM's runtime dependencies into DEST, atomically.
copy() {
  local pom=$1 dest=$2 prop=$3 tmp
  tmp=$(mktemp -d "$cache/.fetch-XXXXXX")
  echo "xsg: fetching $(basename "$dest") from Maven Central (once)" >&2
  if ! mvn -B -q -f "$pom" "-D$prop" dependency:copy-dependencies -DincludeScope=runtime \
        "-DoutputDirectory=$tmp" >"$tmp.log" 2>&1; then
    echo "xsg: mvn could not resolve $(basename "$pom") ($prop); its output:" >&2
    tail -n 20 "$tmp.log" >&2
    rm -rf "$tmp" "$tmp.log"
    return 1
  fi
  rm -f "$tmp.log"
  echo "$tmp"
}

if [ ! -f "$connector/.complete" ]; then
  tmp=$(copy "$root/deploy/kafka/connector.pom.xml" "$connector" "spark.version=$spark_version" | tail -n 1)
  [ -d "$tmp" ] || exit 1
  # Keep only what pyspark lacks: two versions of one library on a classpath is trouble.
  shipped=$(for j in "$spark_jars"/*.jar; do artifact "$j"; done | sort -u)
  for j in "$tmp"/*.jar; do
    if grep -qxF "$(artifact "$j")" <<<"$shipped"; then rm -f "$j"; fi
  done
  ls "$tmp"/spark-sql-kafka-0-10_*.jar >/dev/null
  rm -rf "$connector" && mv "$tmp" "$connector" && touch "$connector/.complete"
  echo "xsg: Kafka connector for Spark $spark_version in $connector: $(cd "$connector" && ls *.jar | tr '\n' ' ')"
fi

if [ ! -f "$broker/.complete" ]; then
  tmp=$(copy "$root/deploy/kafka/broker.pom.xml" "$broker" "kafka.version=$kafka_version" | tail -n 1)
  [ -d "$tmp" ] || exit 1
  rm -rf "$broker" && mv "$tmp" "$broker" && touch "$broker/.complete"
  echo "xsg: Kafka $kafka_version broker and tools in $broker ($(ls "$broker"/*.jar | wc -l) jars)"
fi
