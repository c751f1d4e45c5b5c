# Facts about the machine that every benchmark JSON line records, sourced by
# scripts/bench-suite, scripts/bench-w5 and scripts/bench-w1-breakdown so the
# three read them the same way. Sets:
#   cpu_model     the host's CPU model ("" where unknown): these VMs land on
#                 hosts whose figures differ by 2-7x (BENCHMARKS.md);
#   halt_poll_ns  the guest's halt polling (cpuidle-haltpoll on KVM guests):
#                 how long an idle vCPU polls before it halts, which changes
#                 wake-up latency a lot (BENCHMARKS.md, "Guest halt
#                 polling"); a number, or the JSON literal null where the
#                 machine has no such setting.
cpu_model=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr -d '"\\' | xargs || true)
halt_poll_ns=$(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null || true)
[[ $halt_poll_ns =~ ^[0-9]+$ ]] || halt_poll_ns=null
