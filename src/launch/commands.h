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

// The script the remote shell runs for one process: cd into `workdir`, export
// `env`, start the program in its own session (process group) with stdin
// from /dev/null, and kill that whole group (SIGTERM, SIGKILL `grace_s`
// later) as soon as the ssh channel's stdin reaches end of file, i.e. when
// the launcher closes it to stop the process, or the ssh connection dies.
// Exits with the program's status (128+N when it died on signal N).
std::string remote_script(const std::string& workdir, const std::map<std::string, std::string>& env,
                          const std::vector<std::string>& argv, double grace_s);

// ssh -o BatchMode=yes -p PORT [ssh_options] HOST sh -c '<remote_script>'.
std::vector<std::string> ssh_argv(const LaunchConfig& cfg, const ProcessSpec& p);

// rsync -a over the same ssh (port and options) of `src_dir` into `dst_dir`
// on `host`, creating `dst_dir` there first.
std::vector<std::string> rsync_argv(const LaunchConfig& cfg, const HostEntry& host,
                                    const std::string& src_dir, const std::string& dst_dir);

// OpenMPI mpirun: workers then servers as two app contexts (workers first so
// OMPI_COMM_WORLD_RANK is the worker rank), every variable shared by a role
// forwarded with -x; per-process ranks come from OMPI_COMM_WORLD_*.
// `as_root` adds --allow-run-as-root.
std::vector<std::string> mpirun_argv(const LaunchConfig& cfg, const Rendezvous& rv, bool as_root);

// Slurm: srun over the allocation with --multi-prog; the config text (one
// line per role, tasks 0..N-1 workers, N..N+S-1 servers) goes in the file
// `conf_path`.
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

}  // namespace pushpull::launch
