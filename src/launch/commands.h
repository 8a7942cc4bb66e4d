// SPDX-License-Identifier: Apache-2.0
// Command builders: how each launcher turns a plan into the programs the
// supervisor starts on this host (the processes themselves for `local`, one
// ssh client per remote process for `ssh`, one mpirun or srun for `mpi` and
// `slurm`).
//
// Thread safety: pure functions over values.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "launch/plan.h"

namespace pushpull::launch {

// POSIX sh single-quoting: the result is one word whatever `s` holds.
std::string shell_quote(std::string_view s);
// Quotes every word and joins them with spaces.
std::string shell_join(const std::vector<std::string>& words);

// Whether a variable holds a credential: its name contains SECRET, TOKEN,
// PASSWORD or PASSWD (any case). Such values never appear on a command line
// (ssh: stdin; mpirun: `-x NAME` with the value in mpirun's environment;
// srun: its environment), in the plan or in logs.
bool is_sensitive_name(std::string_view name);
// `value`, or "<hidden>" when `name` is sensitive.
std::string masked_value(std::string_view name, std::string_view value);
// The sensitive variables of `env`.
std::map<std::string, std::string> sensitive_only(const std::map<std::string, std::string>& env);

// The script the remote shell runs for one process: read the sensitive
// variables of `env` from the ssh channel's stdin (one line each, in name
// order: see ssh_stdin), cd into `workdir`, export the other variables, start
// the program in its own session (process group) with stdin from /dev/null,
// and kill that whole group (SIGTERM, SIGKILL `grace_s` later) as soon as the
// channel's stdin reaches end of file, i.e. when the launcher closes it to
// stop the process, or the ssh connection dies. Exits with the program's
// status (128+N when it died on signal N). Every value is single-quoted.
std::string remote_script(const std::string& workdir, const std::map<std::string, std::string>& env,
                          const std::vector<std::string>& argv, double grace_s);
// What the launcher writes to the ssh client's stdin first: the values of
// the sensitive variables of `env`, one line each, in name order. Throws
// InvalidArgument for a value holding a newline.
std::string ssh_stdin(const std::map<std::string, std::string>& env);

// ssh -o BatchMode=yes -p PORT [ssh_options] -- HOST sh -c '<remote_script>'
// ("--" so the host can never be read as an option).
std::vector<std::string> ssh_argv(const LaunchConfig& cfg, const ProcessSpec& p);

// rsync -a over the same ssh (port and options) of `src_dir` into `dst_dir`
// on `host`, creating `dst_dir` there first.
std::vector<std::string> rsync_argv(const LaunchConfig& cfg, const HostEntry& host,
                                    const std::string& src_dir, const std::string& dst_dir);
// rsync -a over the same ssh of the files matching `remote_glob` on `host`
// (the remote shell expands it) into the local folder `dst_dir`.
std::vector<std::string> rsync_fetch_argv(const LaunchConfig& cfg, const HostEntry& host,
                                          const std::string& remote_glob,
                                          const std::string& dst_dir);

// OpenMPI mpirun: workers then servers as two app contexts (workers first so
// OMPI_COMM_WORLD_RANK is the worker rank), every variable shared by a role
// forwarded with -x NAME=VALUE, sensitive ones with -x NAME alone (their
// values go in mpirun's environment: launcher_env); per-process ranks come
// from OMPI_COMM_WORLD_*. `as_root` adds --allow-run-as-root.
std::vector<std::string> mpirun_argv(const LaunchConfig& cfg, const Rendezvous& rv, bool as_root);

// Slurm: srun over the allocation with --multi-prog; the config text (one
// line per role, tasks 0..N-1 workers, N..N+S-1 servers) goes in the file
// `conf_path`. Sensitive variables are left out of it: srun passes its own
// environment (launcher_env) to the tasks.
struct SrunCommand {
  std::vector<std::string> argv;
  std::string multi_prog;  // contents of conf_path
};
SrunCommand srun_command(const LaunchConfig& cfg, const Rendezvous& rv,
                         const std::string& conf_path);

// The variables shared by every process of `role` (process_env without the
// per-process ones: ranks, local ranks, node host).
std::map<std::string, std::string> role_env(const LaunchConfig& cfg, const Rendezvous& rv,
                                            Role role);

// mpi and slurm: the sensitive variables of both roles, which go into
// mpirun's or srun's own environment. Throws InvalidArgument when the roles
// give one of them different values (one environment cannot hold both).
std::map<std::string, std::string> launcher_env(const LaunchConfig& cfg, const Rendezvous& rv);

}  // namespace pushpull::launch
