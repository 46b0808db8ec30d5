#!/usr/bin/env bash
# The CPU figures of docs/benchmarks.md ("The CPU default", "Generation against the machine's
# limits", an engine's start) on the GPU machine's host CPU (an AMX Xeon), with the packed
# weights (ESLAB_CPU_PACKING=auto) and without (off), after install_cpu_host.sh. Each mode
# runs on two physical cores of its own (2 threads, as on a 2-core machine), the two modes side
# by side; then the generation on 8 cores, one mode after the other. Logs go to OUT.
#   bash bench/gpu/cpu_host_bench.sh OUT
set -uo pipefail
OUT=${1:?output folder}
mkdir -p "$OUT"
source bench/gpu/cpu_host_env.sh
# the first logical CPU of each physical core, in order
mapfile -t firsts < <(lscpu -p=CPU,CORE,SOCKET | grep -v '^#' | sort -t, -k3,3n -k2,2n -u -s | cut -d, -f1)
cores() { local IFS=,; echo "${firsts[*]:$1:$2}"; }

run_mode() {  # mode cpus
  local mode=$1 cpus=$2 log="$OUT/cpu-host-$1-2cores.txt"
  echo "# ESLAB_CPU_PACKING=$mode, taskset -c $cpus, $(date -u +%FT%TZ)" > "$log"
  for cmd in "bench/engine_start.py --repeats 1" \
             "bench/generation.py --threads 2" \
             "bench/iteration.py --methods es,lbes --steps 2 --repeats 1"; do
    echo "## python $cmd" >> "$log"
    ESLAB_CPU_PACKING=$mode timeout 420 taskset -c "$cpus" python $cmd >> "$log" 2>&1
    echo "## exit $?" >> "$log"
  done
}
run_mode auto "$(cores 0 2)" & run_mode off "$(cores 2 2)" & wait
for mode in auto off; do
  echo "## ESLAB_CPU_PACKING=$mode taskset -c $(cores 0 8) python bench/generation.py --threads 8" \
    >> "$OUT/cpu-host-8cores.txt"
  ESLAB_CPU_PACKING=$mode timeout 200 taskset -c "$(cores 0 8)" python bench/generation.py --threads 8 \
    >> "$OUT/cpu-host-8cores.txt" 2>&1
done
