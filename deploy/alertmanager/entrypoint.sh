#!/bin/sh
# Alertmanager entrypoint for docker-compose: run the repository's alerts/alertmanager.yml unchanged except for
# where pages go.
#   PAGERDUTY_ROUTING_KEY set            → that key (written to a private file the config points at)
#   routing-key secret file mounted      → that file, as alerts/alertmanager.yml expects
#   neither (the demo)                   → a placeholder key and global.pagerduty_url = the local sink, so pages
#                                          are visible at http://localhost:9099 (docker compose logs pagerduty-sink)
# Ticket and dead-man's-switch webhooks (127.0.0.1:9097 in the repo config) go to the sink too unless
# ALERT_WEBHOOK_BASE is set. The agent's evidence webhook (127.0.0.1:9435 in the repo config) goes to
# INFERWATCH_AGENT_URL (default http://agent:9435) with the token file INFERWATCH_EVIDENCE_TOKEN_FILE (default the
# agent's token volume, /etc/alertmanager/inferwatch/evidence-token). Usage: entrypoint.sh SRC OUT [alertmanager flags...]; with OUT "-" only renders
# to stdout (tests/test_compose.py renders it natively and checks the result with amtool).
set -eu
src="$1"; out="$2"; shift 2
secret=/etc/alertmanager/secrets/pagerduty_routing_key
state="${ALERTMANAGER_STATE_DIR:-/alertmanager}"
sink="${PAGERDUTY_SINK_URL:-http://pagerduty-sink:9099}"
hooks="${ALERT_WEBHOOK_BASE:-$sink}"
keyfile="$state/pagerduty_routing_key"
agent="${INFERWATCH_AGENT_URL:-http://agent:9435}"
evidence_token="${INFERWATCH_EVIDENCE_TOKEN_FILE:-/etc/alertmanager/inferwatch/evidence-token}"
evidence_secret=/etc/alertmanager/secrets/inferwatch_evidence_token
mkdir -p "$state"
umask 077
global_url=""
if [ -n "${PAGERDUTY_ROUTING_KEY:-}" ]; then
  printf '%s\n' "$PAGERDUTY_ROUTING_KEY" > "$keyfile"
  echo "alertmanager: PagerDuty routing key from PAGERDUTY_ROUTING_KEY" >&2
elif [ -s "${PAGERDUTY_ROUTING_KEY_FILE:-$secret}" ] && ! grep -q '^#' "${PAGERDUTY_ROUTING_KEY_FILE:-$secret}"; then
  cp "${PAGERDUTY_ROUTING_KEY_FILE:-$secret}" "$keyfile"
  echo "alertmanager: PagerDuty routing key from the secret file" >&2
else
  printf '%s\n' 00000000000000000000000000000000 > "$keyfile"
  global_url="$sink/v2/enqueue"
  echo "alertmanager: no PagerDuty routing key: pages go to the local sink $sink" >&2
fi
render() {
  if [ -n "$global_url" ]; then
    sed -e "s#$secret#$keyfile#" -e "s#http://127.0.0.1:9097#$hooks#" \
        -e "s#http://127.0.0.1:9435#$agent#" -e "s#$evidence_secret#$evidence_token#" \
        -e "s#^global:#global:\\
  pagerduty_url: $global_url#" "$src"
  else
    sed -e "s#$secret#$keyfile#" -e "s#http://127.0.0.1:9097#$hooks#" \
        -e "s#http://127.0.0.1:9435#$agent#" -e "s#$evidence_secret#$evidence_token#" "$src"
  fi
}
if [ "$out" = "-" ]; then
  render
  exit 0
fi
render > "$out"
exec "${ALERTMANAGER_BIN:-/bin/alertmanager}" --config.file="$out" --storage.path="$state" "$@"
