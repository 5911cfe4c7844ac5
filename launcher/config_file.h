// horovodrun's --config-file: a YAML file with a `controller` (gloo or mpi) and sections of
// knobs (params, autotune, timeline, stall_check, library_options, logging), read as the
// hvdrun flags they stand for. A setting whose flag (or its opposite) is on the command line
// is left out: the command line wins, as in horovodrun.
//
// The file is read as the block YAML such configurations are written in: `key: value` lines,
// one level of indented keys under a section, `#` comments, quoted or plain scalars, YAML's
// booleans (true/false, yes/no, on/off). Anything else (flow mappings, lists, anchors, deeper
// nesting, tabs) is refused naming the line. Settings horovodrun does not read are ignored
// with a warning.
//
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace hvd {
namespace launcher {

struct ConfigFlags {
  std::vector<std::string> flags;             // e.g. "--cycle-time-ms", "10", "--autotune"
  // Each flag's name (no dashes) -> where it came from, e.g. "'params.cycle_time_ms' in c.yaml
  // line 3", for messages about its value.
  std::map<std::string, std::string> origin;
  std::vector<std::string> warnings;          // settings ignored, and why
};

// The flags of the configuration `text` (read from `path`, named in messages). `given` holds
// the long names of the flags on the command line. Throws LaunchError for a file it cannot
// read as such a configuration.
ConfigFlags ConfigFileFlags(const std::string& text, const std::string& path,
                            const std::set<std::string>& given);

// The same, reading the file at `path`.
ConfigFlags ReadConfigFile(const std::string& path, const std::set<std::string>& given);

}  // namespace launcher
}  // namespace hvd
