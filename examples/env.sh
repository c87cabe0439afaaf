#!/bin/sh
# Prints the shell variables the walkthroughs use, for a gateway started by `make run` (or
# `xsg serve`): GW and XSG_URL (the gateway's URL), one variable per demo subject of the data
# directory's auth.json holding its token (NEA, LTA, OTHER, SHIPCO, CAPTAIN, ANALYST), and
# XSG_TOKEN (nea's, for the `xsg policy` and `xsg stream` commands). Use it as
#     eval "$(examples/env.sh)"                       # make run: ./data, port 8080
#     eval "$(examples/env.sh /tmp/x http://127.0.0.1:9000)"
# Arguments: the data directory (default: data) and the gateway's URL (default:
# http://127.0.0.1:8080). It only reads the file; nothing is sent anywhere.
data_dir=${1:-data}
url=${2:-http://127.0.0.1:8080}
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
exec "$python" - "$data_dir/auth.json" "$url" <<'PY'
import json, re, shlex, sys
path, url = sys.argv[1], sys.argv[2]
try:
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
except OSError as e:
    sys.exit(f"examples/env.sh: cannot read {path} ({e.strerror}): start the gateway first "
             "(make run), or name its data directory")
print(f"export GW={shlex.quote(url)} XSG_URL={shlex.quote(url)}")
for entry in entries:
    name = re.sub(r"[^A-Za-z0-9]", "_", entry["subject"]).upper()
    print(f"export {name}={shlex.quote(entry['token'])}")
    if entry["subject"] == "nea":
        print(f"export XSG_TOKEN={shlex.quote(entry['token'])}")
PY
