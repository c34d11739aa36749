#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine (Debian 12: Slurm 22.05, munge, slurmdbd + MariaDB).
# Used by CI and by tests/test_slurm.py; idempotent (running daemons are left alone), root only, no systemd.
#
#   scripts/slurm/up.sh            packages (apt, if missing) + munged + mariadb + slurmdbd + slurmctld + slurmd
#   PFL_SLURM_ACCOUNTING=0 ...     without slurmdbd (submitit then cannot see jobs that die without a result)
#
# Why accounting: submitit polls `sacct` for job states; without it a job killed before writing its
# result leaves job.result() waiting forever. Every wait below is bounded.
set -euo pipefail

ACCOUNTING="${PFL_SLURM_ACCOUNTING:-1}"
PARTITION="${PFL_SLURM_PARTITION:-debug}"
CLUSTER="${PFL_SLURM_CLUSTER:-pflrepro}"
DB_PASSWORD="${PFL_SLURM_DB_PASSWORD:-pflrepro-slurm}"
START=$(date +%s)
say() { echo "[slurm/up +$(( $(date +%s) - START ))s] $*"; }
die() { echo "[slurm/up] $*" >&2; exit 1; }
# wait_for <tries of 0.25 s> <command...>
wait_for() { local n=$1; shift; for _ in $(seq 1 "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done; return 1; }
# a pid file whose process exists and is not a zombie (PID 1 here reaps late; kill -0 succeeds on zombies)
running() { [ -s "$1" ] && local pid && pid=$(cat "$1") && [ -e "/proc/$pid" ] \
            && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$pid/stat" 2>/dev/null; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts system daemons)"

packages=(slurmctld slurmd slurm-client munge)
[ "$ACCOUNTING" = 1 ] && packages+=(slurmdbd mariadb-server)
absent=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || absent+=("$p")
done
if [ "${#absent[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || timeout 300 apt-get update -qq
  timeout 600 apt-get install -y -qq --no-install-recommends "${absent[@]}" >/tmp/pfl_slurm_apt.log 2>&1 \
    || { timeout 300 apt-get update -qq; timeout 600 apt-get install -y -qq --no-install-recommends "${absent[@]}" \
         >/tmp/pfl_slurm_apt.log 2>&1; } || die "apt-get install ${absent[*]} failed: see /tmp/pfl_slurm_apt.log"
  say "installed ${absent[*]}"
fi

# munge: the shared key and the daemon (as user munge)
[ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
chown munge:munge /etc/munge /etc/munge/munge.key && chmod 700 /etc/munge && chmod 600 /etc/munge/munge.key
install -d -o munge -g munge -m 755 /run/munge
install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
running /run/munge/munged.pid || { runuser -u munge -- /usr/sbin/munged; say "munged started"; }
wait_for 40 sh -c 'munge -n </dev/null | unmunge' || die "munge does not answer: see /var/log/munge/munged.log"

install -d -o slurm -g slurm -m 755 /var/lib/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
install -d -m 755 /etc/slurm

# slurm.conf from the hardware slurmd sees; RealMemory above the real value would drain the node
hw=$(slurmd -C | head -1)
field() { echo "$hw" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
memory=$(( $(field RealMemory) * 9 / 10 ))
if [ "$ACCOUNTING" = 1 ]; then
  storage="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819"
else
  storage="AccountingStorageType=accounting_storage/none"
fi
conf="# written by pflrepro scripts/slurm/up.sh
ClusterName=${CLUSTER}
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
JobAcctGatherType=jobacct_gather/linux
${storage}
MinJobAge=300
MaxArraySize=1001
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(field CPUs) Sockets=$(field SocketsPerBoard) CoresPerSocket=$(field CoresPerSocket) ThreadsPerCore=$(field ThreadsPerCore) RealMemory=${memory} State=UNKNOWN
PartitionName=${PARTITION} Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
changed=0
if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null)" != "$conf" ]; then
  printf '%s\n' "$conf" > /etc/slurm/slurm.conf
  changed=1
fi

if [ "$ACCOUNTING" = 1 ]; then
  install -d -o mysql -g root -m 755 /run/mysqld
  if ! mariadb-admin ping >/dev/null 2>&1; then
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >/dev/null
    setsid /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 --innodb-buffer-pool-size=256M \
      --innodb-lock-wait-timeout=900 >/var/log/slurm/mariadb.log 2>&1 </dev/null &
    wait_for 120 mariadb-admin ping || die "mariadb did not start: see /var/log/slurm/mariadb.log"
    say "mariadb started"
  fi
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
              CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '${DB_PASSWORD}';
              ALTER USER 'slurm'@'localhost' IDENTIFIED BY '${DB_PASSWORD}';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  cat > /etc/slurm/slurmdbd.conf <<DBD
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=slurm
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=${DB_PASSWORD}
StorageLoc=slurm_acct_db
DBD
  chown slurm:slurm /etc/slurm/slurmdbd.conf && chmod 600 /etc/slurm/slurmdbd.conf
  running /run/slurmdbd.pid || { slurmdbd; say "slurmdbd started"; }
  wait_for 120 sacctmgr -n list cluster || die "slurmdbd does not answer: see /var/log/slurm/slurmdbd.log"
  sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || { sacctmgr -i add cluster "$CLUSTER" >/dev/null; say "cluster $CLUSTER registered"; }
fi

if [ "$changed" = 1 ] && running /run/slurmctld.pid; then   # plugin changes need a restart
  scontrol shutdown >/dev/null 2>&1 || true
  for _ in $(seq 1 40); do running /run/slurmctld.pid || running /run/slurmd.pid || break; sleep 0.25; done
  say "slurm.conf changed: restarting the daemons"
fi
running /run/slurmctld.pid || { slurmctld; say "slurmctld started"; }
# the hostname is not 'localhost': -N names the node slurmd is
running /run/slurmd.pid || { slurmd -N localhost; say "slurmd started"; }

state=""
for _ in $(seq 1 120); do
  state=$(sinfo -h -n localhost -o %T 2>/dev/null | head -1 || true)
  case "$state" in
    idle|mixed|allocated|completing) break ;;
    down*|drain*) scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 0.25
done
case "$state" in
  idle|mixed|allocated|completing) say "up: $(sinfo -h -o '%P %D %T %N' | head -1) (accounting=$ACCOUNTING)" ;;
  *) die "node not ready (state '$state'): see /var/log/slurm/*.log" ;;
esac
