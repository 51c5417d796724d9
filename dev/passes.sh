# Passes of the test command (sourced by dev/test.sh): each runs whatever the
# ones before it did, and the summary at the end says how each one ended.
#
#   run_pass NAME COMMAND...   runs COMMAND (a function or a program) with its
#                              output shown and kept; never stops the caller
#   passes_summary             prints one line per pass (its own summary line:
#                              pytest's last, jest's "Tests:", else its last
#                              line); returns 1 when any pass failed
#
# Used with set -e in the caller: a pass's command runs under set -e too, in a
# subshell of its own, so its first failing step ends that pass only.

passes_logs=$(mktemp -d)
trap 'rm -rf "$passes_logs"' EXIT
pass_names=()
pass_results=()

# What a pass's log says of it in one line: pytest's last summary line, jest's
# "Tests:" line, else the last line it wrote.
summary_of() {
    local log=$1 line
    line=$(grep -E '^=+ .*(passed|failed|error|skipped|deselected|no tests ran).* in [0-9.]+s' "$log" | tail -n 1 || true)
    [ -n "$line" ] || line=$(grep -E '^Tests: ' "$log" | tail -n 1 || true)
    [ -n "$line" ] || line=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 || true)
    echo "${line:-(no output)}"
}

# run_pass NAME COMMAND...: runs it with its output shown and kept, and notes
# how it ended; never stops the script.
run_pass() {
    local name=$1 status
    shift
    echo "dev/test.sh: --- pass $name ---"
    set +e
    ( set -e; "$@" ) 2>&1 | tee "$passes_logs/$name.log"
    status=${PIPESTATUS[0]}
    set -e
    pass_names+=("$name")
    if [ "$status" -eq 0 ]; then
        pass_results+=("ok      $(summary_of "$passes_logs/$name.log")")
    else
        pass_results+=("FAILED  (exit $status) $(summary_of "$passes_logs/$name.log")")
    fi
}

passes_summary() {
    local i failed=0
    echo
    echo "dev/test.sh: summary"
    for i in "${!pass_names[@]}"; do
        printf '  %-8s %s\n' "${pass_names[$i]}" "${pass_results[$i]}"
        case "${pass_results[$i]}" in FAILED*) failed=1 ;; esac
    done
    if [ "$failed" -ne 0 ]; then
        echo "dev/test.sh: some passes failed (above)" >&2
        return 1
    fi
}
