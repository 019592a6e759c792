#!/usr/bin/env bash
# gdb driver for test/attack/drain_scan_race.pl (run as root): waits for ctl/info (scheduler pid,
# relfilenode of the slot), attaches, runs the two breakpoints, detaches.
CTL=${PGQ_ATTACK_CTL:-/tmp/pgq-attack}
mkdir -p $CTL && chmod 777 $CTL
for i in $(seq 1 3000); do [ -s $CTL/info ] && break; sleep 0.1; done
[ -s $CTL/info ] || { echo "driver: no info"; exit 1; }
read PID REL < $CTL/info
echo "driver: pid $PID rel $REL"
cat > $CTL/gdb.cmd <<EOF
set pagination off
set confirm off
handle SIGUSR1 nostop noprint pass
handle SIGUSR2 nostop noprint pass
handle SIGALRM nostop noprint pass
handle SIGINT nostop noprint pass
handle SIGTERM nostop noprint pass
handle SIGQUIT nostop noprint pass
handle SIGHUP nostop noprint pass
handle SIGPIPE nostop noprint pass
handle SIGURG nostop noprint pass
handle SIGCHLD nostop noprint pass
break *VirtualXactLock
break *heapgetpage if *(unsigned int *)(*(long *)\$rdi + 8) == $REL
disable 2
commands 1
  silent
  printf "bp1: VirtualXactLock\n"
  shell touch $CTL/go1; for i in \$(seq 1 1200); do [ -e $CTL/done1 ] && break; sleep 0.1; done
  disable 1
  enable 2
  continue
end
commands 2
  silent
  printf "bp2: heapgetpage page %u\n", \$rsi
  shell touch $CTL/go2; for i in \$(seq 1 1200); do [ -e $CTL/done2 ] && break; sleep 0.1; done
  disable 2
  detach
  quit
end
continue
EOF
timeout 300 gdb -p $PID -batch -x $CTL/gdb.cmd 2>&1 | grep -v "^\[New\|^Reading\|^warning: \|^(No debugging" 
echo "driver: gdb done"
