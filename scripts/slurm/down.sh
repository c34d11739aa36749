#!/usr/bin/env bash
# Stop the one-node Slurm cluster of scripts/slurm/up.sh (idempotent; only the daemons named in pid files).
#   scripts/slurm/down.sh           cancel jobs, stop slurmd, slurmctld, slurmdbd, mariadb, munged
#   scripts/slurm/down.sh --purge   also wipe Slurm state, logs and the accounting database
set -uo pipefail
purge=0; [ "${1:-}" = "--purge" ] && purge=1
running() { [ -e "/proc/$1" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
stop() {  # <pid file> <name>: TERM, wait up to 15 s, then KILL
  [ -s "$1" ] || return 0
  local pid; pid=$(cat "$1")
  if running "$pid"; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 300); do running "$pid" || break; sleep 0.05; done
    running "$pid" && kill -9 "$pid" 2>/dev/null && echo "[slurm/down] $2 killed"
    echo "[slurm/down] $2 stopped"
  fi
  rm -f "$1"
}
if [ -s /run/slurmctld.pid ] && running "$(cat /run/slurmctld.pid)"; then
  jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
  [ -n "${jobs// }" ] && { timeout 10 scancel $jobs 2>/dev/null; echo "[slurm/down] cancelled $jobs"; sleep 1; }
fi
stop /run/slurmd.pid slurmd
stop /run/slurmctld.pid slurmctld
stop /run/slurmdbd.pid slurmdbd
if [ "$purge" = 1 ] && command -v mariadb >/dev/null && mariadb-admin ping >/dev/null 2>&1; then
  mariadb -e "DROP DATABASE IF EXISTS slurm_acct_db;"
fi
stop /run/mysqld/mysqld.pid mariadb
stop /run/munge/munged.pid munged
[ "$purge" = 1 ] && rm -rf /var/lib/slurm/slurmctld/* /var/lib/slurm/slurmd/* /var/log/slurm/*
exit 0
