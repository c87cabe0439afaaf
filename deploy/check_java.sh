#!/usr/bin/env bash
# Spark 4 needs Java 17 or newer. Say plainly what to install when it is missing.
set -u
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "xsg: Java 17+ is required by Spark but no 'java' was found." >&2
  echo "     Install it, e.g. 'apt-get install openjdk-17-jre-headless' (Debian/Ubuntu)" >&2
  echo "     or set JAVA_HOME to a JDK/JRE 17+ installation." >&2
  exit 1
fi
ver=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${ver%%.*}
[ "$major" = "1" ] && major=$(echo "$ver" | cut -d. -f2)
if [ -z "$major" ] || [ "$major" -lt 17 ] 2>/dev/null; then
  echo "xsg: Java $ver found, but Spark 4 needs Java 17 or newer." >&2
  echo "     Install e.g. 'apt-get install openjdk-17-jre-headless' and put it first on PATH or in JAVA_HOME." >&2
  exit 1
fi
