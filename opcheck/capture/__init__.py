"""`opcheck capture`: record an op's calls in a user's command and write them as spec samples.

- targets: what `--op` selects, and how its calls are seen (function mode, dispatch mode, patching);
- recorder / child: the process that runs the command with the recording on;
- select: deduplicate by signature and keep at most a cap per op, keeping what differs;
- render / write: samples as YAML text, new spec files or new items in an existing spec;
- run / summary: the command's orchestration and what it prints.
"""
