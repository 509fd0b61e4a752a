#!/usr/bin/env bash
# The services the tests use, answering before pytest starts (`make test` runs this first):
# PostgreSQL on 127.0.0.1:5432, with trust auth for the user postgres or root and a database
# `test`, and Redis on 127.0.0.1:6379. One that is not answering is started when this machine can
# (a Debian cluster with pg_ctlcluster, redis-server), a missing database `test` is created; what
# still does not answer is named, with how to get it, and the script exits 1 so that `make test`
# stops here rather than in a hundred failed tests.
#
# SVIR_SERVICES_PG_PORT, SVIR_SERVICES_REDIS_PORT and SVIR_SERVICES_PG_DATABASE point the checks
# elsewhere only to try this script (tests/test_services_script.py): the tests use the above.
set -u
HOST=127.0.0.1
PG_PORT=${SVIR_SERVICES_PG_PORT:-5432}
PG_DATABASE=${SVIR_SERVICES_PG_DATABASE:-test}
PG_USERS=(postgres root)
REDIS_PORT=${SVIR_SERVICES_REDIS_PORT:-6379}
problems=()

say() { printf 'services: %s\n' "$*" >&2; }

port_open() (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null

pg_answers() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h "$HOST" -p "$PG_PORT" -t 3
  else
    port_open "$PG_PORT"
  fi
}

# A PING over bash's /dev/tcp: no redis-cli needed.
redis_answers() (
  exec 3<>"/dev/tcp/$HOST/$REDIS_PORT" || exit 1
  printf 'PING\r\n' >&3
  IFS= read -r -t 3 reply <&3 || exit 1
  [[ $reply == +PONG* ]]
) 2>/dev/null

# Up to 15 s for a service just started to answer.
wait_for() {
  local i
  for ((i = 0; i < 75; i++)); do
    "$1" && return 0
    sleep 0.2
  done
  return 1
}

start_note=""
if ! pg_answers; then
  clusters=(/etc/postgresql/*/main)
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d "${clusters[0]}" ]; then
    version=${clusters[0]#/etc/postgresql/}
    version=${version%/main}
    say "starting PostgreSQL $version (pg_ctlcluster $version main start)"
    out=$(pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>&1) ||
      start_note=" (pg_ctlcluster $version main start said: $out)"
    wait_for pg_answers
  fi
fi
if ! pg_answers; then
  problems+=("PostgreSQL is not answering on $HOST:$PG_PORT$start_note. The tests need it there,\
 with trust auth for the user postgres or root and a database \`$PG_DATABASE\`. Install it\
 (Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql) and start it\
 (pg_ctlcluster <version> main start, or brew services start postgresql); on Debian this script\
 starts an installed cluster itself.")
elif ! command -v psql >/dev/null 2>&1; then
  problems+=("PostgreSQL answers on $HOST:$PG_PORT, but psql is not installed to check the\
 database \`$PG_DATABASE\`: install the PostgreSQL client (Debian/Ubuntu: apt-get install\
 postgresql-client).")
else
  # The tests connect as postgres, else root, without a password (tests/threads/conftest.py).
  errors=""
  ready=""
  for user in "${PG_USERS[@]}"; do
    if out=$(PGCONNECT_TIMEOUT=5 psql -w -X -q -h "$HOST" -p "$PG_PORT" -U "$user" \
      -d "$PG_DATABASE" -Atc 'select 1' 2>&1); then
      ready=$user
      break
    fi
    if [[ $out == *"database \"$PG_DATABASE\" does not exist"* ]] &&
      out=$(PGCONNECT_TIMEOUT=5 createdb -w -h "$HOST" -p "$PG_PORT" -U "$user" \
        "$PG_DATABASE" 2>&1); then
      say "created the database $PG_DATABASE (as $user)"
      ready=$user
      break
    fi
    errors+=" $user: ${out//$'\n'/ }"
  done
  if [ -z "$ready" ]; then
    problems+=("PostgreSQL answers on $HOST:$PG_PORT, but neither postgres nor root can use the\
 database \`$PG_DATABASE\` without a password:$errors. The tests need trust auth from $HOST\
 (pg_hba.conf: host all all 127.0.0.1/32 trust, then reload) and the database\
 (createdb -h $HOST -U postgres $PG_DATABASE).")
  fi
fi

start_note=""
if ! redis_answers; then
  if command -v redis-server >/dev/null 2>&1; then
    say "starting Redis on $HOST:$REDIS_PORT (log: /tmp/svir-redis.log)"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" \
      --appendonly no --dir /tmp --logfile /tmp/svir-redis.log >/dev/null 2>&1 ||
      start_note=" (redis-server did not start: see /tmp/svir-redis.log)"
    wait_for redis_answers
  fi
fi
if ! redis_answers; then
  problems+=("Redis is not answering PING on $HOST:$REDIS_PORT$start_note. The tests need it\
 there, without a password. Install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew\
 install redis): this script starts an installed redis-server itself.")
fi

if [ ${#problems[@]} -gt 0 ]; then
  for problem in "${problems[@]}"; do
    say "$problem"
  done
  say "not running the tests: fix the above, then run make test again."
  exit 1
fi
