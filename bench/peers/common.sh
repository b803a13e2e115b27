# What run_cnn.sh and run_gpt.sh share (sourced, after they set $here, $out
# and $tag): the peers' python, the machine's load, the median of a column,
# and a run timed in wall clock and in CPU time of its whole process tree.

log() { echo "bench/$tag: $*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null | tr ' ' '/'; }
median() { # of the numbers on stdin, one a line
    sort -n | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

# The venv's python in $py (bench/peers/venv.sh, from PyPI once), or "" with a note when there is none.
peers_python() {
    py=$(sh "$here/venv.sh" 2>>"$out/venv.log") || { log "no bench/.venv (see $out/venv.log): peers skipped"; py=""; }
}

# CPU ticks (user + system) of a process and its descendants so far (/proc/PID/stat fields 14, 15).
cpu_tree() {
    t=0
    for q in $1 $(pgrep -P "$1"); do
        [ "$q" = "$1" ] || { t=$((t + $(cpu_tree "$q"))); continue; }
        st=$(sed 's/^.*) //' "/proc/$q/stat" 2>/dev/null) || continue # fields from 3 on
        t=$((t + $(echo "$st" | awk '{ print $12 + $13 }')))
    done
    echo "$t"
}

# timed PATTERN FROM TO STEPS LOGFILE CMD...: runs CMD (a shell function is fine) with its output in
# LOGFILE and sets $cpu to the CPU time, in ms per step, of every thread of its process tree between
# the FROM-th and the TO-th line matching PATTERN (its progress lines), STEPS steps apart: on a loaded
# machine the wall clock is mostly the wait for a core, the CPU time is not. Sampled when the lines
# appear (polled every 0.2 s); $cpu is empty when a block was too short to be seen alone.
# Exit status: CMD's. (Its variables are t_*: POSIX sh has no locals.)
timed() {
    t_pat=$1 t_from=$2 t_to=$3 t_steps=$4 t_lf=$5
    shift 5
    "$@" >"$t_lf" 2>&1 &
    t_bg=$!; t_c1=""; t_c2=""; cpu=""
    while kill -0 "$t_bg" 2>/dev/null; do
        t_n=$(grep -c "$t_pat" "$t_lf" 2>/dev/null)
        [ "$t_n" = "$t_from" ] && [ -z "$t_c1" ] && t_c1=$(cpu_tree "$t_bg")
        [ "$t_n" = "$t_to" ] && [ -n "$t_c1" ] && [ -z "$t_c2" ] && t_c2=$(cpu_tree "$t_bg")
        sleep 0.2
    done
    wait "$t_bg"; t_rc=$?
    [ -n "$t_c2" ] && cpu=$(awk -v a="$t_c1" -v b="$t_c2" -v hz="$(getconf CLK_TCK)" -v k="$t_steps" \
        'BEGIN { printf "%.1f", (b - a) * 1000 / hz / k }')
    return $t_rc
}
