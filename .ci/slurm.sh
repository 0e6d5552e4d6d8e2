#!/usr/bin/env bash
# A real single-node Slurm (munged + slurmctld + slurmd, all as root) for
# gacc's integration tests, with every file it uses under one folder.
#
#   eval "$(.ci/slurm.sh up DIR)"   # installs if needed, starts, waits, prints `export SLURM_CONF=...`
#   .ci/slurm.sh down DIR           # stops slurmd, slurmctld, munged; safe to repeat
#
# SLURM_CI_PORT (default 6817) picks slurmctld's port, slurmd gets the next one.
# If `up` fails it prints the daemons' log tails and leaves whatever it started
# running for a look: callers run `down` (e.g. from an EXIT trap) either way.
#
# `up` reuses daemons from DIR that are already running. No slurmdbd, so there
# is no sacct: finished jobs stay in `squeue -t all` / `scontrol show job` for
# MinJobAge seconds. Stdout carries only the export line; progress goes to stderr.
set -euo pipefail

PKGS=(slurmctld slurmd slurm-client munge)
READY_TIMEOUT=${SLURM_CI_READY_TIMEOUT:-60}
# slurmctld listens on PORT, slurmd on PORT+1. These are machine-wide: a second
# cluster on the same machine (another DIR) needs another SLURM_CI_PORT.
CTLD_PORT=${SLURM_CI_PORT:-6817}
SLURMD_PORT=$((CTLD_PORT + 1))

T0=${EPOCHREALTIME/[^0-9]/}
log() {
	local t=${EPOCHREALTIME/[^0-9]/}
	t=$(((t - T0) / 100000))
	printf 'slurm.sh [+%d.%ds]: %s\n' $((t / 10)) $((t % 10)) "$*" >&2
}
die() {
	log "error: $*"
	show_logs
	exit 1
}

usage() {
	echo "usage: $0 up DIR | down DIR" >&2
	exit 2
}

# Every path below is derived from DIR; set by set_paths.
set_paths() {
	mkdir -p "$1"
	DIR=$(cd "$1" && pwd -P)
	CONF=$DIR/slurm.conf
	MUNGE_DIR=$DIR/munge
	MUNGE_KEY=$MUNGE_DIR/munge.key
	MUNGE_SOCK_DIR=$MUNGE_DIR/run
	MUNGE_SOCK=$MUNGE_SOCK_DIR/munge.socket
	MUNGE_PID=$MUNGE_DIR/munged.pid
	MUNGE_LOG=$MUNGE_DIR/munged.log
	MUNGE_SEED=$MUNGE_DIR/munged.seed
	CTLD_PID=$DIR/run/slurmctld.pid
	SLURMD_PID=$DIR/run/slurmd.pid
	CTLD_LOG=$DIR/log/slurmctld.log
	SLURMD_LOG=$DIR/log/slurmd.log
}

show_logs() {
	[[ -n ${DIR:-} ]] || return 0
	local f
	for f in "$MUNGE_LOG" "$CTLD_LOG" "$SLURMD_LOG"; do
		if [[ -s $f ]]; then
			printf '==> %s (last 40 lines) <==\n' "$f" >&2
			tail -n 40 "$f" >&2 || true
		fi
	done
}

# The pid in FILE if that process is alive and was started for this DIR.
live_pid() {
	local file=$1 pid
	[[ -s $file ]] || return 1
	pid=$(tr -dc '0-9' <"$file")
	[[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
	# munged's command line names its socket, slurmctld/slurmd name the conf.
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$DIR/" || return 1
	echo "$pid"
}

install_packages() {
	local missing=0 cmd
	for cmd in munged munge unmunge slurmctld slurmd sbatch squeue sinfo scontrol srun; do
		command -v "$cmd" >/dev/null 2>&1 || missing=1
	done
	((missing)) || return 0
	mkdir -p "$DIR/log"
	local apt_log=$DIR/log/apt.log
	log "installing ${PKGS[*]} (apt output: $apt_log)"
	export DEBIAN_FRONTEND=noninteractive
	local p need_update=0
	for p in "${PKGS[@]}"; do
		apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]' || need_update=1
	done
	if ((need_update)); then
		apt-get update -qq >>"$apt_log" 2>&1 || true
	fi
	# Package scripts must not start system-wide munge/slurm services: ours
	# run from DIR only. policy-rc.d exiting 101 tells invoke-rc.d so.
	local policy=/usr/sbin/policy-rc.d made_policy=0
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		made_policy=1
	fi
	local ok=0
	local apt=(apt-get install -y -qq --no-install-recommends -o Dpkg::Use-Pty=0 "${PKGS[@]}")
	if "${apt[@]}" >>"$apt_log" 2>&1 </dev/null; then
		ok=1
	else
		# Stale package lists (the mirror moved on): refresh once and retry.
		apt-get update -qq >>"$apt_log" 2>&1 || true
		"${apt[@]}" >>"$apt_log" 2>&1 </dev/null && ok=1
	fi
	if ((made_policy)); then rm -f "$policy"; fi
	if ((!ok)); then
		tail -n 40 "$apt_log" >&2
		die "apt-get install ${PKGS[*]} failed"
	fi
	log "installed"
}

start_munged() {
	if live_pid "$MUNGE_PID" >/dev/null; then
		log "munged already running (pid $(live_pid "$MUNGE_PID"))"
		return 0
	fi
	mkdir -p "$MUNGE_DIR" "$MUNGE_SOCK_DIR"
	# Clients (any user) connect to the socket, so its folder and every
	# folder above it must be readable and searchable.
	chmod 755 "$MUNGE_DIR" "$MUNGE_SOCK_DIR"
	if [[ ! -s $MUNGE_KEY ]]; then
		dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
	fi
	chown "$(id -u):$(id -g)" "$MUNGE_KEY"
	chmod 400 "$MUNGE_KEY"
	rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock"
	# --force: munged refuses to start if a folder on the way to its key,
	# socket or log is writable by others without the sticky bit (DIR under
	# a group-writable CI folder, say); it also clears a stale socket.
	munged --force \
		--key-file="$MUNGE_KEY" \
		--socket="$MUNGE_SOCK" \
		--pid-file="$MUNGE_PID" \
		--log-file="$MUNGE_LOG" \
		--seed-file="$MUNGE_SEED" >&2 ||
		die "munged did not start"
	local i
	for ((i = 0; i < 50; i++)); do
		[[ -S $MUNGE_SOCK ]] && live_pid "$MUNGE_PID" >/dev/null && break
		sleep 0.1
	done
	munge -n -S "$MUNGE_SOCK" | unmunge -S "$MUNGE_SOCK" >/dev/null ||
		die "munged is not answering on $MUNGE_SOCK"
	log "munged up (pid $(live_pid "$MUNGE_PID"))"
}

write_conf() {
	mkdir -p "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log"
	local tmp=$CONF.tmp.$$
	cat >"$tmp" <<EOF
# Single-node Slurm for gacc's integration tests; written by .ci/slurm.sh.
ClusterName=gacc
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$CTLD_LOG
SlurmdLogFile=$SLURMD_LOG
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
# Finished jobs stay visible to squeue/scontrol this long (no slurmdbd here).
MinJobAge=600
MaxArraySize=10001
MaxJobCount=100000
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
# A job past its time limit gets SIGTERM, then SIGKILL this many seconds later.
KillWait=2
OverTimeLimit=0
NodeName=localhost CPUs=8 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
	if [[ -f $CONF ]] && cmp -s "$tmp" "$CONF"; then
		rm -f "$tmp"
	else
		mv -f "$tmp" "$CONF"
		chmod 644 "$CONF"
		CONF_CHANGED=1
	fi
}

start_slurmctld() {
	if live_pid "$CTLD_PID" >/dev/null; then
		log "slurmctld already running (pid $(live_pid "$CTLD_PID"))"
		if ((CONF_CHANGED)); then
			log "slurm.conf changed: scontrol reconfigure"
			scontrol reconfigure >&2 || true
		fi
		return 0
	fi
	slurmctld -f "$CONF" >&2 || die "slurmctld did not start"
	log "slurmctld started"
}

start_slurmd() {
	if live_pid "$SLURMD_PID" >/dev/null; then
		log "slurmd already running (pid $(live_pid "$SLURMD_PID"))"
		return 0
	fi
	slurmd -f "$CONF" -N localhost >&2 || die "slurmd did not start"
	log "slurmd started"
}

wait_ready() {
	local deadline=$((SECONDS + READY_TIMEOUT)) state=""
	until scontrol ping 2>/dev/null | grep -q 'is UP'; do
		((SECONDS < deadline)) || die "slurmctld not answering after ${READY_TIMEOUT}s"
		sleep 0.2
	done
	while :; do
		state=$(sinfo -h -N -n localhost -o '%t' 2>/dev/null || true)
		case $state in
		idle | mix | alloc) break ;;
		down* | drain* | fail*) scontrol update NodeName=localhost State=RESUME >&2 2>&1 || true ;;
		esac
		((SECONDS < deadline)) || die "node localhost is '${state:-unknown}', not idle, after ${READY_TIMEOUT}s"
		sleep 0.2
	done
	log "node localhost is $state"
	# A batch job, polled with squeue: `sbatch --wait` polls with a growing
	# interval and would add seconds here.
	local jid st=""
	jid=$(sbatch --parsable -J slurm.sh-check -o /dev/null -t 1 --wrap true) ||
		die "sbatch failed"
	while :; do
		st=$(squeue -h -t all -j "$jid" -o '%T' 2>/dev/null || true)
		case $st in
		COMPLETED) break ;;
		FAILED | CANCELLED | TIMEOUT | NODE_FAIL | BOOT_FAIL | OUT_OF_MEMORY | PREEMPTED | DEADLINE)
			die "trivial batch job $jid ended $st"
			;;
		esac
		((SECONDS < deadline)) || die "trivial batch job $jid still '${st:-unknown}' after ${READY_TIMEOUT}s"
		sleep 0.1
	done
	local left=$((deadline - SECONDS))
	((left > 5)) || left=5
	timeout "$left" srun -J slurm.sh-check -N1 -n1 -t 1 true </dev/null >&2 ||
		die "a trivial srun job did not run"
	log "srun and sbatch jobs ran"
}

# True if something on this machine accepts TCP connections on PORT.
port_busy() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

cmd_up() {
	set_paths "$1"
	# Non-root submitters need to reach slurm.conf and the munge socket.
	chmod a+rx "$DIR"
	CONF_CHANGED=0
	# Another cluster on our ports would answer our clients instead of ours.
	if ! live_pid "$CTLD_PID" >/dev/null && port_busy "$CTLD_PORT"; then
		die "port $CTLD_PORT is taken (another Slurm on this machine?); set SLURM_CI_PORT"
	fi
	if ! live_pid "$SLURMD_PID" >/dev/null && port_busy "$SLURMD_PORT"; then
		die "port $SLURMD_PORT is taken (another slurmd on this machine?); set SLURM_CI_PORT"
	fi
	install_packages
	start_munged
	write_conf
	export SLURM_CONF=$CONF
	start_slurmctld
	start_slurmd
	wait_ready
	log "ready: SLURM_CONF=$CONF"
	printf 'export SLURM_CONF=%q\n' "$CONF"
}

# True while PID exists and is not a zombie (PID 1 in a container may be
# slow to reap the daemons, which it inherited when they detached).
alive() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[[ ${stat:0:1} != Z ]]
}

stop_one() {
	local name=$1 file=$2 pid i
	pid=$(live_pid "$file") || {
		rm -f "$file"
		return 0
	}
	log "stopping $name (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 300; i++)); do
		alive "$pid" || break
		sleep 0.1
	done
	if alive "$pid"; then
		log "$name ignored SIGTERM for 30s: SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do
			alive "$pid" || break
			sleep 0.1
		done
	fi
	rm -f "$file"
}

cmd_down() {
	[[ -d $1 ]] || return 0
	set_paths "$1"
	# Jobs' processes belong to slurmstepd, which outlives slurmd: cancel
	# them while the controller is still there to do it.
	if live_pid "$CTLD_PID" >/dev/null && [[ -f $CONF ]]; then
		export SLURM_CONF=$CONF
		local jobs i
		jobs=$(squeue -h -t PD,R,CG,S -o '%A' 2>/dev/null || true)
		if [[ -n $jobs ]]; then
			log "cancelling jobs: ${jobs//$'\n'/ }"
			# shellcheck disable=SC2086
			scancel $jobs 2>/dev/null || true
			for ((i = 0; i < 100; i++)); do
				[[ -z $(squeue -h -t R,CG -o '%A' 2>/dev/null || true) ]] && break
				sleep 0.2
			done
		fi
	fi
	stop_one slurmd "${SLURMD_PID:-}"
	stop_one slurmctld "${CTLD_PID:-}"
	stop_one munged "${MUNGE_PID:-}"
	log "down"
}

[[ $# -eq 2 && -n $2 ]] || usage
case $1 in
up) cmd_up "$2" ;;
down) cmd_down "$2" ;;
*) usage ;;
esac
