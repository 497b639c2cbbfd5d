// A thin Kubernetes REST client over libcurl and nlohmann-json: kubeconfig / in-cluster credentials
// (bearer token re-read when the service-account token file rotates, exec credential plugins such as
// gke-gcloud-auth-plugin, client certificates), JSON calls that turn API errors into messages naming
// what to fix, and line-oriented streams (watches, log follows) multiplexed on one curl multi handle.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster/env.h"
#include "core/error.h"

namespace olmosft::cluster {

struct KubeConfig {
  std::string server;  // https://host:port (http:// allowed for loopback tests)
  std::string ca_file, ca_pem;
  bool insecure = false;
  std::string token;       // static bearer token
  std::string token_file;  // re-read when it changes (service-account token rotation)
  std::string client_cert_pem, client_key_pem, client_cert_file, client_key_file;
  std::vector<std::string> exec_argv;  // exec credential plugin
  std::vector<std::pair<std::string, std::string>> exec_env;
  std::string namespace_;  // default namespace from the context / service account
  std::string source;      // where these came from (for messages)
  std::string auth_hint;   // what to do on 401
};

// Parses a kubeconfig file (context: "" = current-context). Throws naming the file and key on bad input.
KubeConfig load_kubeconfig(const std::string& path, const std::string& context = "");
// In-cluster: token, ca.crt and namespace under sa_dir, server from KUBERNETES_SERVICE_HOST/PORT.
KubeConfig in_cluster_config(const std::string& sa_dir, const EnvLookup& env);
// --kubeconfig flag, else $KUBECONFIG (first file), else in-cluster when KUBERNETES_SERVICE_HOST is set and
// the token exists, else ~/.kube/config.
KubeConfig resolve_config(const std::string& kubeconfig_flag, const std::string& context,
                          const EnvLookup& env,
                          const std::string& sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

class KubeError : public Error {
 public:
  KubeError(const std::string& what, long status, std::string reason)
      : Error(what), status(status), reason(std::move(reason)) {}
  long status;
  std::string reason;
};

struct HttpResult {
  long status = 0;  // 0: transport failure (curl_error says why)
  std::string body;
  std::string curl_error;
  int curl_code = 0;
};

class KubeClient {
 public:
  explicit KubeClient(KubeConfig cfg);
  ~KubeClient();
  KubeClient(const KubeClient&) = delete;
  KubeClient& operator=(const KubeClient&) = delete;

  const KubeConfig& config() const { return cfg_; }

  // One request; retries once after re-reading credentials on 401. Never throws for HTTP errors.
  HttpResult raw(const std::string& method, const std::string& path, const std::string& body = "",
                 const std::string& content_type = "application/json");
  // Same, but a non-2xx answer throws KubeError with explain()'s message. `what` names the operation.
  nlohmann::json call(const std::string& method, const std::string& path, const std::string& what,
                      const std::string& body = "", const std::string& content_type = "application/json");
  nlohmann::json get(const std::string& path, const std::string& what) { return call("GET", path, what); }
  nlohmann::json post(const std::string& path, const nlohmann::json& body, const std::string& what) {
    return call("POST", path, what, body.dump());
  }
  nlohmann::json merge_patch(const std::string& path, const nlohmann::json& body, const std::string& what) {
    return call("PATCH", path, what, body.dump(), "application/merge-patch+json");
  }

  // A clear message for a failed request: what failed, and what to fix (credentials, RBAC, CRDs, server).
  std::string explain(const HttpResult& r, const std::string& method, const std::string& path,
                      const std::string& what);

  // Internals shared with StreamSet.
  void setup_handle(void* curl, const std::string& url);  // TLS options
  std::string auth_header(bool force_refresh = false);    // "Authorization: Bearer ..." or ""
  std::string url(const std::string& path) const { return cfg_.server + path; }

 private:
  bool serves_core_api();  // GET /api answers with a Kubernetes APIVersions object
  KubeConfig cfg_;
  std::string token_;
  std::chrono::steady_clock::time_point token_read_{};
  long long token_mtime_ = -1;
  std::chrono::system_clock::time_point token_expiry_{};
  bool have_token_ = false;
};

// Line streams (watch=1, log follow=true) on one curl multi handle. Callbacks run inside poll().
class StreamSet {
 public:
  using LineFn = std::function<void(const std::string& line)>;
  // status: HTTP status (0 if none); error_body: the body of a non-2xx answer; curl_error: transport error
  // ("" when the server ended the stream cleanly).
  using DoneFn =
      std::function<void(long status, const std::string& error_body, const std::string& curl_error)>;

  explicit StreamSet(KubeClient& client);
  ~StreamSet();
  StreamSet(const StreamSet&) = delete;
  StreamSet& operator=(const StreamSet&) = delete;

  int start(const std::string& path, LineFn on_line, DoneFn on_done, long low_speed_seconds = 0);
  void cancel(int id);
  void poll(int timeout_ms);
  size_t active() const { return streams_.size(); }

  struct Stream;  // (public only so the libcurl write callback can reach it)

 private:
  KubeClient& client_;
  void* multi_;
  int next_id_ = 1;
  std::map<int, std::unique_ptr<Stream>> streams_;
};

// URL-escapes a query value (label selectors, times).
std::string url_escape(const std::string& s);

}  // namespace olmosft::cluster
