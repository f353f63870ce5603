#!/bin/bash
# Record what this machine's Slurm prints for the queries hpc_train/scheduler makes, into
# tests/scheduler/fixtures/<version>/ (run on a test cluster; it submits and cancels its own jobs).
# The command lines here must stay those of hpc_train/scheduler/__init__.py (its formats: parse.py).
set -euo pipefail
version=$(sinfo --version | awk '{print $2}' | cut -d. -f1,2)
out=$(cd "$(dirname "$0")" && pwd)/fixtures/$version
mkdir -p "$out"
work=$(mktemp -d)
cd "$work"
sub() { sbatch --parsable --time=1 --mem=100 -o /dev/null "$@"; }
plain=$(sub -J fx-plain --wrap 'sleep 15')
echo "$plain" > "$out/sbatch_parsable.txt"
failed=$(sub -J fx-failed --wrap 'exit 3')
array=$(sub -J fx-array --array=0-1 --wrap 'sleep 15')
throttled=$(sub -J fx-throttled --array=0-3%1 --wrap 'sleep 8')
waiting=$(sub -J fx-dependent --dependency=afterok:"$plain" --wrap 'true')
later=$(sub -J fx-later --begin=now+1hour --wrap 'true')
requeued=$(sub -J fx-requeued --requeue --wrap 'srun sleep 6')
ids="$plain,$failed,$array,$throttled,$waiting,$later,$requeued"
until [ "$(squeue -h -j "$requeued" -o %T)" = RUNNING ]; do sleep 1; done
sleep 1
query='%i|%T|%r|%M|%e|%D|%N'
squeue -h -r -j "$ids" -o "$query" > "$out/squeue_live.txt"
squeue -h -j "$ids" -o "$query" > "$out/squeue_live_unexpanded.txt"
scontrol show job -o "$requeued" > "$out/scontrol_show_job_running.txt"
scontrol show job -o "$throttled"_3 > "$out/scontrol_show_job_array_task_pending.txt"
scontrol show job -o "$waiting" > "$out/scontrol_show_job_dependency.txt"
scontrol requeue "$requeued"
scontrol show job -o "$requeued" > "$out/scontrol_show_job_requeued_completing.txt"
sleep 3
scontrol show job -o "$requeued" > "$out/scontrol_show_job_requeued_pending.txt"
squeue -h -r -j "$requeued" -o "$query" > "$out/squeue_requeued.txt"
scontrol requeue "$requeued" 2> "$out/scontrol_requeue_pending.stderr" || true
scancel "$later"
until [ -z "$(squeue -h -j "$ids" -o %i 2>/dev/null)" ]; do sleep 2; done
sleep 2
scontrol show job -o "$requeued" > "$out/scontrol_show_job_requeued_done.txt" || true
scontrol show job -o "$array"_1 > "$out/scontrol_show_job_array_task.txt" || true
scontrol show job -o "$failed" > "$out/scontrol_show_job_failed.txt" || true
scontrol show job -o "$plain" > "$out/scontrol_show_job_completed.txt" || true
squeue -h -r -j 2147483000 -o "$query" 2> "$out/squeue_invalid_id.stderr" || true
if scancel "$plain" 2> "$out/scancel_done.stderr"; then echo "exit 0" >> "$out/scancel_done.stderr"; else echo "exit $?" >> "$out/scancel_done.stderr"; fi
sacct -X -n -P -o JobID,State,Reason,ElapsedRaw,ExitCode,NNodes,NodeList -j "$ids" > "$out/sacct_jobs.txt"
sacct -D -P -n -o JobID,State,Start,End,ElapsedRaw,AllocCPUS,AllocTRES,ReqMem,MaxRSS,TotalCPU,NNodes,NodeList \
    -j "$ids" > "$out/sacct_segments.txt"
never=$(sub -J fx-array-later --array=0-1 --begin=now+1hour --wrap true)
scancel "$never"; sleep 2
sacct -X -n -P -o JobID,State,Reason,ElapsedRaw,ExitCode,NNodes,NodeList -j "$never" > "$out/sacct_jobs_array_never_started.txt"
sinfo -h -o '%P %a %D %T' > "$out/sinfo_partitions.txt"
sinfo -h -o %m > "$out/sinfo_memory.txt"
scontrol ping > "$out/scontrol_ping.txt"
echo "ids: $ids" > "$out/README"
sinfo --version >> "$out/README"
rm -rf "$work"
