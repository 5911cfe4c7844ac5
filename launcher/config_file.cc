#include "config_file.h"

#include <cctype>
#include <sstream>

#include "hosts.h"  // LaunchError

namespace hvd {
namespace launcher {
namespace {

// One `key: value` of the file: section "" for a top-level scalar (controller).
struct Setting {
  std::string section, key, value;
  bool null = false;  // no value, ~ or null: left unset, as horovodrun leaves it
  int line = 0;
};

// How a setting becomes flags: a value flag takes the value as it is; a switch is `on` when
// the value is true and `off` when false. Any flag in `wins` on the command line leaves the
// setting out.
struct Mapping {
  const char* section;
  const char* key;
  const char* on;   // the value flag, or the switch's flag for true
  const char* off;  // nullptr for a value flag
  std::vector<std::string> wins;
};

const std::vector<Mapping>& Mappings() {
  static const std::vector<Mapping> m = {
      {"params", "fusion_threshold_mb", "fusion-threshold-mb", nullptr, {}},
      {"params", "cycle_time_ms", "cycle-time-ms", nullptr, {}},
      {"params", "cache_capacity", "cache-capacity", nullptr, {}},
      {"params", "hierarchical_allreduce", "hierarchical-allreduce", "no-hierarchical-allreduce", {}},
      {"params", "hierarchical_allgather", "hierarchical-allgather", "no-hierarchical-allgather", {}},
      {"autotune", "enabled", "autotune", "no-autotune", {}},
      {"autotune", "log_file", "autotune-log-file", nullptr, {}},
      {"autotune", "warmup_samples", "autotune-warmup-samples", nullptr, {}},
      {"autotune", "steps_per_sample", "autotune-steps-per-sample", nullptr, {}},
      {"autotune", "bayes_opt_max_samples", "autotune-bayes-opt-max-samples", nullptr, {}},
      {"autotune", "gaussian_process_noise", "autotune-gaussian-process-noise", nullptr, {}},
      {"timeline", "filename", "timeline-filename", nullptr, {"timeline"}},
      {"timeline", "mark_cycles", "timeline-mark-cycles", "no-timeline-mark-cycles", {}},
      {"stall_check", "enabled", "stall-check", "no-stall-check", {}},
      {"stall_check", "warning_time_seconds", "stall-check-warning-time-seconds", nullptr,
       {"stall-check-seconds"}},
      {"stall_check", "shutdown_time_seconds", "stall-check-shutdown-time-seconds", nullptr, {}},
      {"library_options", "mpi_threads_disable", "mpi-threads-disable", "no-mpi-threads-disable", {}},
      {"library_options", "num_nccl_streams", "num-nccl-streams", nullptr, {}},
      {"library_options", "ccl_bgt_affinity", "thread-affinity", nullptr, {}},
      {"library_options", "gloo_timeout_seconds", "gloo-timeout-seconds", nullptr, {"timeout"}},
      {"logging", "level", "log-level", nullptr, {}},
      {"logging", "with_timestamp", "log-with-timestamp", "log-without-timestamp",
       {"log-hide-timestamp", "no-log-hide-timestamp"}},
      {"logging", "hide_timestamp", "log-hide-timestamp", "no-log-hide-timestamp",
       {"log-with-timestamp", "log-without-timestamp"}},
  };
  return m;
}

[[noreturn]] void Refuse(const std::string& path, int line, const std::string& what) {
  throw LaunchError("--config-file " + path + " line " + std::to_string(line) + ": " + what);
}

// The line without its comment: a # at its start or after a blank, outside quotes.
std::string StripComment(const std::string& line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      return line.substr(0, i);
    }
  }
  return line;
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// A scalar as YAML reads it: quotes removed (with '' and \" \\ inside them), and whether it
// is null.
std::string Scalar(const std::string& raw, const std::string& path, int line, bool* null) {
  *null = raw.empty() || raw == "~" || raw == "null" || raw == "Null" || raw == "NULL";
  if (*null) return "";
  const char q = raw[0];
  if (q == '\'' || q == '"') {
    if (raw.size() < 2 || raw.back() != q) Refuse(path, line, "unterminated quote in " + raw);
    std::string out;
    for (size_t i = 1; i + 1 < raw.size(); ++i) {
      if (q == '\'' && raw[i] == '\'' && raw[i + 1] == '\'') ++i;       // '' is one '
      else if (q == '"' && raw[i] == '\\' && i + 2 < raw.size()) ++i;  // \" and \\ .
      out.push_back(raw[i]);
    }
    return out;
  }
  if (std::string("{[&*!|>%@`").find(q) != std::string::npos) {
    Refuse(path, line, "'" + raw + "' is YAML hvdrun does not read here; write each setting "
                       "as a plain 'key: value' line");
  }
  return raw;
}

std::vector<Setting> ParseSettings(const std::string& text, const std::string& path) {
  std::vector<Setting> out;
  std::istringstream in(text);
  std::string section;     // the open section, "" at the top level
  int section_indent = 0;  // its keys' indent, 0 until its first key
  int n = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++n;
    const size_t lead = raw.find_first_not_of(' ');
    if (lead != std::string::npos && raw[lead] == '\t') {
      Refuse(path, n, "a tab in the indent (YAML indents with spaces)");
    }
    const std::string line = Trim(StripComment(raw));
    if (line.empty()) continue;
    const int indent = static_cast<int>(lead);
    if (indent == 0 && line == "---" && out.empty()) continue;
    if (indent == 0 && line == "...") break;
    // The key ends at the first ':' followed by a blank or the end of the line.
    size_t colon = std::string::npos;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == ':' && (i + 1 == line.size() || line[i + 1] == ' ')) {
        colon = i;
        break;
      }
    }
    if (colon == std::string::npos || colon == 0) {
      Refuse(path, n, "expected 'key: value' or 'section:', found '" + line + "'");
    }
    Setting s;
    bool key_null = false;
    s.key = Scalar(Trim(line.substr(0, colon)), path, n, &key_null);
    const std::string value = Trim(line.substr(colon + 1));
    s.line = n;
    if (indent == 0) {
      section.clear();
      section_indent = 0;
      if (value.empty()) {
        section = s.key;  // a section's keys follow, indented
        continue;
      }
    } else {
      if (section.empty()) Refuse(path, n, "an indented line outside a section");
      if (section_indent == 0) section_indent = indent;
      if (indent != section_indent) {
        Refuse(path, n, "indented unlike the lines above it in '" + section + "' (hvdrun reads "
                        "one level of 'key: value' under each section)");
      }
      s.section = section;
    }
    s.value = Scalar(value, path, n, &s.null);
    out.push_back(std::move(s));
  }
  return out;
}

bool IsTrue(const std::string& v) {
  for (const char* t : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "1"}) {
    if (v == t) return true;
  }
  return false;
}

bool IsFalse(const std::string& v) {
  for (const char* f : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "0"}) {
    if (v == f) return true;
  }
  return false;
}

}  // namespace

ConfigFlags ConfigFileFlags(const std::string& text, const std::string& path,
                            const std::set<std::string>& given) {
  ConfigFlags out;
  auto any_given = [&](std::initializer_list<const char*> names, const std::vector<std::string>& more) {
    for (const char* f : names) {
      if (f != nullptr && given.count(f)) return true;
    }
    for (const auto& f : more) {
      if (given.count(f)) return true;
    }
    return false;
  };
  for (const Setting& s : ParseSettings(text, path)) {
    const std::string where = "'" + (s.section.empty() ? s.key : s.section + "." + s.key) +
                              "' in " + path + " line " + std::to_string(s.line);
    if (s.section.empty() && s.key == "controller") {
      if (s.null || any_given({"gloo", "mpi", "mpi-args", "binding-args"}, {})) continue;
      std::string c = s.value;
      for (char& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (c != "gloo" && c != "mpi") {
        Refuse(path, s.line, "controller '" + s.value + "' (expected gloo or mpi)");
      }
      out.flags.push_back("--" + c);
      out.origin[c] = where;
      continue;
    }
    const Mapping* m = nullptr;
    for (const Mapping& candidate : Mappings()) {
      if (s.section == candidate.section && s.key == candidate.key) m = &candidate;
    }
    if (m == nullptr) {
      out.warnings.push_back(where + " is not a setting horovodrun reads; ignored");
      continue;
    }
    if (s.null || any_given({m->on, m->off}, m->wins)) continue;
    if (m->off == nullptr) {
      out.flags.push_back(std::string("--") + m->on);
      out.flags.push_back(s.value);
      out.origin[m->on] = where;
      continue;
    }
    const bool on = IsTrue(s.value);
    if (!on && !IsFalse(s.value)) {
      Refuse(path, s.line, "'" + s.value + "' for " + s.section + "." + s.key +
                           " (expected true or false)");
    }
    const char* flag = on ? m->on : m->off;
    out.flags.push_back(std::string("--") + flag);
    out.origin[flag] = where;
  }
  return out;
}

ConfigFlags ReadConfigFile(const std::string& path, const std::set<std::string>& given) {
  return ConfigFileFlags(ReadUserFile("--config-file", path), path, given);
}

}  // namespace launcher
}  // namespace hvd
