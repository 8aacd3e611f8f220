# rounds.sh - sourced by the bench/exp_*.sh scripts that compare two
# programs: `alternate ROUNDS A B` runs the shell functions A and B with
# the round number, A first in odd rounds and B first in even ones, so a
# shared machine's background load falls on both.
alternate() {
    n=$1 a=$2 b=$3
    for r in $(seq 1 "$n"); do
        if [ $((r % 2)) = 1 ]; then
            "$a" "$r"
            "$b" "$r"
        else
            "$b" "$r"
            "$a" "$r"
        fi
    done
}
