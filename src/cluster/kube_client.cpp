#include "cluster/kube_client.h"

#include <curl/curl.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "cluster/timeutil.h"
#include "core/signals.h"

namespace olmosft::cluster {

namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  OLMO_CHECK(f, what, ": cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
  return s.substr(i);
}

std::string base64_decode(const std::string& in, const std::string& what) {
  static const std::string chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    if (c == '=' || c == '\n' || c == '\r' || c == ' ') continue;
    auto pos = chars.find(c);
    OLMO_CHECK(pos != std::string::npos, what, ": not valid base64 (character '", c, "')");
    val = (val << 6) + static_cast<int>(pos);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xff));
      bits -= 8;
    }
  }
  return out;
}

size_t append_cb(char* p, size_t sz, size_t n, void* ud) {
  static_cast<std::string*>(ud)->append(p, sz * n);
  return sz * n;
}

std::string shell_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

long long file_mtime_ns(const std::string& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return -1;
  return static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

// Describes what the request needed in RBAC terms: verb, resource (with group) and namespace.
struct RbacNeed {
  std::string verb, resource, ns;
};
RbacNeed rbac_need(const std::string& method, const std::string& path) {
  std::string p = path.substr(0, path.find('?'));
  std::string q = path.find('?') == std::string::npos ? "" : path.substr(path.find('?'));
  std::vector<std::string> seg;
  std::stringstream ss(p);
  std::string s;
  while (std::getline(ss, s, '/'))
    if (!s.empty()) seg.push_back(s);
  RbacNeed r;
  size_t i = 0;
  std::string group;
  if (!seg.empty() && seg[0] == "api")
    i = 2;
  else if (seg.size() >= 3 && seg[0] == "apis")
    group = seg[1], i = 3;
  if (i + 1 < seg.size() && seg[i] == "namespaces") r.ns = seg[i + 1], i += 2;
  bool named = false;
  if (i < seg.size()) {
    r.resource = seg[i];
    if (i + 1 < seg.size()) named = true;
    if (i + 2 < seg.size()) r.resource += "/" + seg[i + 2];
  }
  if (!group.empty()) r.resource += "." + group;
  if (method == "GET")
    r.verb = q.find("watch=1") != std::string::npos ? "watch" : (named ? "get" : "list");
  else if (method == "POST")
    r.verb = "create";
  else if (method == "PATCH")
    r.verb = "patch";
  else if (method == "DELETE")
    r.verb = "delete";
  else
    r.verb = method;
  return r;
}

std::string crd_hint(const std::string& group) {
  if (group == "jobset.x-k8s.io")
    return "install JobSet (kubectl apply --server-side -f "
           "https://github.com/kubernetes-sigs/jobset/releases/download/<version>/manifests.yaml) or check "
           "`kubectl api-resources --api-group=jobset.x-k8s.io`";
  if (group == "kueue.x-k8s.io")
    return "install Kueue (its release manifests.yaml) or check `kubectl api-resources "
           "--api-group=kueue.x-k8s.io`";
  return "check `kubectl api-resources --api-group=" + group + "`";
}

}  // namespace

// ---------------------------------------------------------------- configuration

KubeConfig load_kubeconfig(const std::string& path, const std::string& context) {
  namespace fs = std::filesystem;
  OLMO_CHECK(std::filesystem::is_regular_file(path), "kubeconfig ", path,
             ": cannot read (no such file); fix --kubeconfig / $KUBECONFIG, or get credentials with "
             "`gcloud container clusters get-credentials`");
  const std::string text = read_file(path, "kubeconfig");
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail("kubeconfig ", path, ": not valid YAML (", e.what(),
         "); fix the file or point --kubeconfig elsewhere");
  }
  OLMO_CHECK(root && root.IsMap(), "kubeconfig ", path, ": expected a YAML map (kind: Config)");
  const fs::path base = fs::path(path).parent_path();
  auto resolve = [&](const std::string& p) { return fs::path(p).is_absolute() ? p : (base / p).string(); };
  std::string ctx_name = context;
  if (ctx_name.empty()) {
    OLMO_CHECK(root["current-context"] && root["current-context"].IsScalar() &&
                   !root["current-context"].Scalar().empty(),
               "kubeconfig ", path,
               ": no current-context; pass --context NAME or set one with "
               "`kubectl config use-context`");
    ctx_name = root["current-context"].Scalar();
  }
  auto find_named = [&](const char* list, const std::string& name) -> YAML::Node {
    YAML::Node l = root[list];
    OLMO_CHECK(l && l.IsSequence(), "kubeconfig ", path, ": missing '", list, "' list");
    for (const auto& e : l)
      if (e["name"] && e["name"].Scalar() == name) return e;
    fail("kubeconfig ", path, ": ", list, " has no entry named '", name, "'");
  };
  YAML::Node ctx = find_named("contexts", ctx_name)["context"];
  OLMO_CHECK(ctx && ctx.IsMap() && ctx["cluster"] && ctx["user"], "kubeconfig ", path, ": context '",
             ctx_name, "' needs 'cluster' and 'user'");
  KubeConfig c;
  c.source = "kubeconfig " + path + " (context " + ctx_name + ")";
  if (ctx["namespace"]) c.namespace_ = ctx["namespace"].Scalar();
  YAML::Node cl = find_named("clusters", ctx["cluster"].Scalar())["cluster"];
  OLMO_CHECK(cl && cl.IsMap() && cl["server"] && !cl["server"].Scalar().empty(), "kubeconfig ", path,
             ": cluster '", ctx["cluster"].Scalar(), "' has no server URL (clusters[].cluster.server)");
  c.server = cl["server"].Scalar();
  while (!c.server.empty() && c.server.back() == '/') c.server.pop_back();
  OLMO_CHECK(c.server.rfind("https://", 0) == 0 || c.server.rfind("http://", 0) == 0, "kubeconfig ", path,
             ": clusters[].cluster.server '", c.server, "' must start with https:// (or http://)");
  if (cl["certificate-authority-data"])
    c.ca_pem = base64_decode(cl["certificate-authority-data"].Scalar(),
                             "kubeconfig " + path + ": certificate-authority-data");
  if (cl["certificate-authority"]) c.ca_file = resolve(cl["certificate-authority"].Scalar());
  if (cl["insecure-skip-tls-verify"]) c.insecure = cl["insecure-skip-tls-verify"].as<std::string>() == "true";
  const std::string user_name = ctx["user"].Scalar();
  YAML::Node u = find_named("users", user_name)["user"];
  OLMO_CHECK(u && u.IsMap(), "kubeconfig ", path, ": user '", user_name, "' has no 'user' map");
  if (u["token"]) c.token = u["token"].Scalar();
  if (u["tokenFile"]) c.token_file = resolve(u["tokenFile"].Scalar());
  if (u["client-certificate-data"])
    c.client_cert_pem = base64_decode(u["client-certificate-data"].Scalar(),
                                      "kubeconfig " + path + ": client-certificate-data");
  if (u["client-key-data"])
    c.client_key_pem =
        base64_decode(u["client-key-data"].Scalar(), "kubeconfig " + path + ": client-key-data");
  if (u["client-certificate"]) c.client_cert_file = resolve(u["client-certificate"].Scalar());
  if (u["client-key"]) c.client_key_file = resolve(u["client-key"].Scalar());
  if (u["exec"]) {
    YAML::Node e = u["exec"];
    OLMO_CHECK(e["command"] && !e["command"].Scalar().empty(), "kubeconfig ", path, ": users[", user_name,
               "].user.exec needs a command");
    // Like client-go: a relative command with a path separator is relative to the kubeconfig's directory.
    std::string cmd = e["command"].Scalar();
    if (cmd.find('/') != std::string::npos) cmd = resolve(cmd);
    c.exec_argv.push_back(cmd);
    if (e["args"])
      for (const auto& a : e["args"]) c.exec_argv.push_back(a.Scalar());
    if (e["env"] && e["env"].IsSequence())
      for (const auto& kv : e["env"]) c.exec_env.emplace_back(kv["name"].Scalar(), kv["value"].Scalar());
  }
  OLMO_CHECK(!u["auth-provider"], "kubeconfig ", path, ": users[", user_name,
             "] uses the removed auth-provider mechanism; switch to an exec plugin (on GKE: install "
             "gke-gcloud-auth-plugin and re-run `gcloud container clusters get-credentials`)");
  const bool has_cert = !c.client_cert_pem.empty() || !c.client_cert_file.empty();
  OLMO_CHECK(!c.token.empty() || !c.token_file.empty() || !c.exec_argv.empty() || has_cert, "kubeconfig ",
             path, ": user '", user_name,
             "' has no credentials (token, tokenFile, exec or client certificate)");
  if (!c.exec_argv.empty())
    c.auth_hint = "refresh the login behind the exec plugin '" + c.exec_argv[0] +
                  "' (on GKE: `gcloud auth login` or set CLOUDSDK_CORE_ACCOUNT to the agent service account)";
  else if (!c.token_file.empty())
    c.auth_hint = "replace the token in " + c.token_file + " (users[" + user_name + "].user.tokenFile)";
  else if (!c.token.empty())
    c.auth_hint = "replace users[" + user_name + "].user.token in " + path + " with a valid token";
  else
    c.auth_hint = "renew the client certificate of user '" + user_name + "' in " + path;
  return c;
}

KubeConfig in_cluster_config(const std::string& sa_dir, const EnvLookup& env) {
  KubeConfig c;
  auto host = env("KUBERNETES_SERVICE_HOST");
  auto port = env("KUBERNETES_SERVICE_PORT");
  OLMO_CHECK(host && !host->empty(),
             "in-cluster config: KUBERNETES_SERVICE_HOST is not set (not running in a pod?)");
  std::string h = *host;
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";  // IPv6
  c.server = "https://" + h + ":" + (port && !port->empty() ? *port : "443");
  c.token_file = sa_dir + "/token";
  OLMO_CHECK(std::filesystem::exists(c.token_file), "in-cluster config: no service-account token at ",
             c.token_file, "; set automountServiceAccountToken: true on the pod or pass --kubeconfig");
  if (std::filesystem::exists(sa_dir + "/ca.crt")) c.ca_file = sa_dir + "/ca.crt";
  if (std::filesystem::exists(sa_dir + "/namespace"))
    c.namespace_ = trim(read_file(sa_dir + "/namespace", "namespace"));
  c.source = "in-cluster service account (" + sa_dir + ")";
  c.auth_hint =
      "the service-account token at " + c.token_file +
      " was re-read and still rejected: check the pod's serviceAccountName and that the account exists";
  return c;
}

KubeConfig resolve_config(const std::string& kubeconfig_flag, const std::string& context,
                          const EnvLookup& env, const std::string& sa_dir) {
  if (!kubeconfig_flag.empty()) return load_kubeconfig(kubeconfig_flag, context);
  if (auto k = env("KUBECONFIG"); k && !k->empty()) {
    std::string first = k->substr(0, k->find(':'));
    return load_kubeconfig(first, context);
  }
  if (auto h = env("KUBERNETES_SERVICE_HOST"); h && !h->empty() && std::filesystem::exists(sa_dir + "/token"))
    return in_cluster_config(sa_dir, env);
  auto home = env("HOME");
  OLMO_CHECK(home && !home->empty(), "no kubeconfig: pass --kubeconfig, set KUBECONFIG, or run in a pod");
  const std::string p = *home + "/.kube/config";
  OLMO_CHECK(
      std::filesystem::exists(p), "no kubeconfig: ", p,
      " does not exist; pass --kubeconfig FILE, set KUBECONFIG, or run inside a pod with a service account");
  return load_kubeconfig(p, context);
}

// ---------------------------------------------------------------- client

KubeClient::KubeClient(KubeConfig cfg) : cfg_(std::move(cfg)) { global_init(); }
KubeClient::~KubeClient() = default;

std::string KubeClient::auth_header(bool force) {
  using clock = std::chrono::steady_clock;
  if (!cfg_.token_file.empty()) {
    long long mt = file_mtime_ns(cfg_.token_file);
    // Re-read when the file changed (kubelet rotates projected tokens), at least every minute, or on demand.
    if (force || !have_token_ || mt != token_mtime_ ||
        clock::now() - token_read_ > std::chrono::seconds(60)) {
      token_ = trim(read_file(cfg_.token_file, "bearer token file"));
      token_mtime_ = mt;
      token_read_ = clock::now();
      have_token_ = true;
    }
  } else if (!cfg_.exec_argv.empty()) {
    if (force || !have_token_ ||
        std::chrono::system_clock::now() + std::chrono::seconds(60) > token_expiry_) {
      std::string cmd =
          "env KUBERNETES_EXEC_INFO=" +
          shell_quote(R"({"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential",)"
                      R"("spec":{"interactive":false}})");
      for (const auto& [k, v] : cfg_.exec_env) cmd += " " + shell_quote(k + "=" + v);
      for (const auto& a : cfg_.exec_argv) cmd += " " + shell_quote(a);
      FILE* p = nullptr;
      {
        const StopSignalsUnblocked child_mask;  // the child inherits this thread's mask (core/signals.h)
        p = ::popen(cmd.c_str(), "r");
      }
      OLMO_CHECK(p, "exec credential plugin '", cfg_.exec_argv[0], "': cannot start");
      std::string out;
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      int rc = ::pclose(p);
      OLMO_CHECK(rc == 0, "exec credential plugin '", cfg_.exec_argv[0], "' (from ", cfg_.source,
                 ") failed (status ", rc, "): ", cfg_.auth_hint);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(out);
        token_ = j.at("status").at("token").get<std::string>();
      } catch (const std::exception& e) {
        fail("exec credential plugin '", cfg_.exec_argv[0],
             "': output is not an ExecCredential with status.token (", e.what(), ")");
      }
      token_expiry_ = std::chrono::system_clock::now() + std::chrono::hours(1);
      if (j["status"].contains("expirationTimestamp")) {
        int64_t ns = parse_rfc3339_ns(j["status"]["expirationTimestamp"].get<std::string>());
        if (ns > 0) token_expiry_ = std::chrono::system_clock::time_point(std::chrono::nanoseconds(ns));
      }
      have_token_ = true;
    }
  } else {
    token_ = cfg_.token;
  }
  if (token_.empty()) return "";
  return "Authorization: Bearer " + token_;
}

void KubeClient::setup_handle(void* hv, const std::string& u) {
  CURL* h = static_cast<CURL*>(hv);
  curl_easy_setopt(h, CURLOPT_URL, u.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 30L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 15L);
  if (cfg_.insecure) {
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!cfg_.ca_pem.empty()) {
    curl_blob b{const_cast<char*>(cfg_.ca_pem.data()), cfg_.ca_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(h, CURLOPT_CAINFO_BLOB, &b);
  } else if (!cfg_.ca_file.empty()) {
    curl_easy_setopt(h, CURLOPT_CAINFO, cfg_.ca_file.c_str());
  }
  if (!cfg_.client_cert_pem.empty()) {
    curl_blob b{const_cast<char*>(cfg_.client_cert_pem.data()), cfg_.client_cert_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(h, CURLOPT_SSLCERT_BLOB, &b);
    curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
  } else if (!cfg_.client_cert_file.empty()) {
    curl_easy_setopt(h, CURLOPT_SSLCERT, cfg_.client_cert_file.c_str());
  }
  if (!cfg_.client_key_pem.empty()) {
    curl_blob b{const_cast<char*>(cfg_.client_key_pem.data()), cfg_.client_key_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(h, CURLOPT_SSLKEY_BLOB, &b);
    curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
  } else if (!cfg_.client_key_file.empty()) {
    curl_easy_setopt(h, CURLOPT_SSLKEY, cfg_.client_key_file.c_str());
  }
}

HttpResult KubeClient::raw(const std::string& method, const std::string& path, const std::string& body,
                           const std::string& content_type) {
  HttpResult r;
  for (int attempt = 0; attempt < 2; ++attempt) {
    CURL* h = curl_easy_init();
    OLMO_CHECK(h, "libcurl: curl_easy_init failed");
    setup_handle(h, url(path));
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
    r = HttpResult{};
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, append_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r.body);
    curl_slist* hdrs = nullptr;
    std::string auth = auth_header(attempt > 0);
    if (!auth.empty()) hdrs = curl_slist_append(hdrs, auth.c_str());
    hdrs = curl_slist_append(hdrs, "Accept: application/json");
    if (!body.empty() || method == "POST" || method == "PATCH" || method == "PUT") {
      hdrs = curl_slist_append(hdrs, ("Content-Type: " + content_type).c_str());
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    char errbuf[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode rc = curl_easy_perform(h);
    r.curl_code = static_cast<int>(rc);
    if (rc != CURLE_OK) {
      r.curl_error = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    } else {
      curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    // 401 with a credential that can change (file, plugin): refresh once and retry.
    if (r.status == 401 && attempt == 0 && (!cfg_.token_file.empty() || !cfg_.exec_argv.empty())) continue;
    break;
  }
  return r;
}

// True when the server answers GET /api with a Kubernetes APIVersions object (every API server does).
bool KubeClient::serves_core_api() {
  const HttpResult a = raw("GET", "/api");
  if (a.status != 200) return false;
  try {
    const auto j = nlohmann::json::parse(a.body);
    return j.is_object() && j.value("kind", "") == "APIVersions";
  } catch (...) {
    return false;
  }
}

std::string KubeClient::explain(const HttpResult& r, const std::string& method, const std::string& path,
                                const std::string& what) {
  std::string msg, reason;
  try {
    auto j = nlohmann::json::parse(r.body);
    if (j.is_object()) {
      msg = j.value("message", "");
      reason = j.value("reason", "");
    }
  } catch (...) {
  }
  if (msg.empty()) msg = r.body.substr(0, 300);
  std::ostringstream o;
  o << what << ": ";
  if (r.status == 0) {
    const bool tls = r.curl_code == CURLE_PEER_FAILED_VERIFICATION ||
                     r.curl_code == CURLE_SSL_CACERT_BADFILE || r.curl_code == CURLE_SSL_CONNECT_ERROR ||
                     r.curl_code == CURLE_SSL_CERTPROBLEM;
    if (tls)
      o << "TLS with " << cfg_.server << " failed (" << r.curl_error << "); fix the certificate-authority / "
        << "client certificate in " << cfg_.source;
    else
      o << "cannot reach the API server " << cfg_.server << " (" << r.curl_error
        << "); check the server URL in " << cfg_.source
        << " and that this host may connect to it (network, VPN, DNS endpoint)";
    return o.str();
  }
  const RbacNeed need = rbac_need(method, path);
  switch (r.status) {
    case 401:
      o << "401 Unauthorized from " << cfg_.server << ": the credentials from " << cfg_.source
        << " were rejected (expired or revoked token). Fix: " << cfg_.auth_hint;
      break;
    case 403:
      o << "403 Forbidden: " << msg << ". Fix: grant this identity RBAC verb '" << need.verb << "' on '"
        << need.resource << "'" << (need.ns.empty() ? "" : " in namespace '" + need.ns + "'")
        << " (docs/k8s.md lists the Role the launcher needs"
        << (need.resource.find("workloads.kueue") == 0
                ? "; Kueue's workload-editor role allows patching Workloads"
                : "")
        << ")";
      break;
    case 404: {
      // Tell a missing CRD (the whole group/version is not served) from a missing object.
      std::string group_version;
      if (path.rfind("/apis/", 0) == 0) {
        std::stringstream ss(path.substr(6));
        std::string g, v;
        std::getline(ss, g, '/');
        std::getline(ss, v, '/');
        v = v.substr(0, v.find('?'));
        group_version = g + "/" + v;
        HttpResult d = raw("GET", "/apis/" + g + "/" + v);
        if (d.status == 404 && !serves_core_api()) {
          o << "404 Not Found from " << cfg_.server
            << ", which does not answer like a Kubernetes API server (GET /api gives no APIVersions); "
               "check the server URL in "
            << cfg_.source;
          break;
        }
        if (d.status == 404) {
          o << "404: the API " << group_version << " is not served by " << cfg_.server
            << " (its CRDs are missing). Fix: " << crd_hint(g);
          break;
        }
      }
      o << "404 Not Found: " << msg;
      break;
    }
    case 409:
      o << "409 " << (reason.empty() ? "Conflict" : reason) << ": " << msg;
      if (reason == "AlreadyExists")
        o << ". JobSets are immutable: render again for a new name, or delete the old run";
      break;
    case 415:
      o << "415 Unsupported Media Type: " << msg;
      break;
    default:
      o << r.status << " " << reason << ": " << msg;
  }
  return o.str();
}

nlohmann::json KubeClient::call(const std::string& method, const std::string& path, const std::string& what,
                                const std::string& body, const std::string& content_type) {
  HttpResult r = raw(method, path, body, content_type);
  if (r.status < 200 || r.status >= 300) {
    std::string reason;
    try {
      reason = nlohmann::json::parse(r.body).value("reason", "");
    } catch (...) {
    }
    throw KubeError(explain(r, method, path, what), r.status, reason);
  }
  if (r.body.empty()) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(r.body);
  } catch (const std::exception& e) {
    throw KubeError(what + ": the API server answered " + std::to_string(r.status) +
                        " with a body that is not JSON (" + e.what() + ")",
                    r.status, "");
  }
}

// ---------------------------------------------------------------- streams

struct StreamSet::Stream {
  CURL* h = nullptr;
  curl_slist* hdrs = nullptr;
  std::string buf, err_body;
  long status = -1;
  bool added = false, cancelled = false;
  LineFn on_line;
  DoneFn on_done;
  std::exception_ptr error;  // thrown by a callback; rethrown from poll() (never through libcurl's C frames)
  char errbuf[CURL_ERROR_SIZE] = {0};
};

static size_t stream_write_cb(char* p, size_t sz, size_t n, void* ud);

StreamSet::StreamSet(KubeClient& client) : client_(client), multi_(curl_multi_init()) {
  OLMO_CHECK(multi_, "libcurl: curl_multi_init failed");
}

StreamSet::~StreamSet() {
  for (auto& [id, s] : streams_) {
    if (s->added) curl_multi_remove_handle(static_cast<CURLM*>(multi_), s->h);
    curl_easy_cleanup(s->h);
    curl_slist_free_all(s->hdrs);
  }
  curl_multi_cleanup(static_cast<CURLM*>(multi_));
}

int StreamSet::start(const std::string& path, LineFn on_line, DoneFn on_done, long low_speed_seconds) {
  auto s = std::make_unique<Stream>();
  s->h = curl_easy_init();
  OLMO_CHECK(s->h, "libcurl: curl_easy_init failed");
  client_.setup_handle(s->h, client_.url(path));
  std::string auth = client_.auth_header();
  if (!auth.empty()) s->hdrs = curl_slist_append(s->hdrs, auth.c_str());
  curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, s->hdrs);
  curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, stream_write_cb);
  curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s.get());
  curl_easy_setopt(s->h, CURLOPT_ERRORBUFFER, s->errbuf);
  if (low_speed_seconds > 0) {
    curl_easy_setopt(s->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(s->h, CURLOPT_LOW_SPEED_TIME, low_speed_seconds);
  }
  s->on_line = std::move(on_line);
  s->on_done = std::move(on_done);
  int id = next_id_++;
  streams_[id] = std::move(s);
  return id;
}

void StreamSet::cancel(int id) {
  auto it = streams_.find(id);
  if (it != streams_.end()) it->second->cancelled = true;
}

static size_t stream_write_cb(char* p, size_t sz, size_t n, void* ud) {
  auto* s = static_cast<StreamSet::Stream*>(ud);
  const size_t len = sz * n;
  if (s->cancelled) return 0;  // aborts the transfer
  if (s->status < 0) curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
  if (s->status < 200 || s->status >= 300) {
    if (s->err_body.size() < 65536) s->err_body.append(p, len);
    return len;
  }
  s->buf.append(p, len);
  size_t start = 0, nl;
  while ((nl = s->buf.find('\n', start)) != std::string::npos) {
    std::string line = s->buf.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    start = nl + 1;
    try {
      s->on_line(line);
    } catch (...) {
      s->error = std::current_exception();
      s->cancelled = true;
      return 0;
    }
    if (s->cancelled) break;
  }
  s->buf.erase(0, start);
  return len;
}

void StreamSet::poll(int timeout_ms) {
  CURLM* m = static_cast<CURLM*>(multi_);
  for (auto& [id, s] : streams_) {
    if (!s->added && !s->cancelled) {
      curl_multi_add_handle(m, s->h);
      s->added = true;
    }
  }
  int running = 0;
  curl_multi_perform(m, &running);
  // curl_multi_poll waits the full timeout even with no transfer, so a caller's loop never spins.
  curl_multi_poll(m, nullptr, 0, timeout_ms, nullptr);
  curl_multi_perform(m, &running);
  // Finished transfers.
  std::vector<std::pair<int, CURLcode>> done;
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(m, &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    for (auto& [id, s] : streams_)
      if (s->h == msg->easy_handle) done.emplace_back(id, msg->data.result);
  }
  // Cancelled streams that did not finish by themselves.
  for (auto& [id, s] : streams_) {
    bool listed = false;
    for (auto& d : done) listed = listed || d.first == id;
    if (s->cancelled && !listed) done.emplace_back(id, CURLE_ABORTED_BY_CALLBACK);
  }
  std::exception_ptr first_error;
  for (auto& [id, code] : done) {
    auto it = streams_.find(id);
    if (it == streams_.end()) continue;
    std::unique_ptr<Stream> s = std::move(it->second);
    streams_.erase(it);
    if (s->added) curl_multi_remove_handle(m, s->h);
    long status = s->status;
    if (status < 0) curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
    std::string cerr = code == CURLE_OK ? "" : (s->errbuf[0] ? s->errbuf : curl_easy_strerror(code));
    if (code == CURLE_OK && status >= 200 && status < 300 && !s->buf.empty() && !s->cancelled)
      s->on_line(s->buf);
    curl_easy_cleanup(s->h);
    curl_slist_free_all(s->hdrs);
    if (s->error) {
      if (!first_error) first_error = s->error;
      continue;
    }
    if (!s->cancelled) {
      try {
        s->on_done(status < 0 ? 0 : status, s->err_body, cerr);
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

std::string url_escape(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string o;
  for (unsigned char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~')
      o += static_cast<char>(c);
    else
      o += '%', o += hex[c >> 4], o += hex[c & 15];
  }
  return o;
}

}  // namespace olmosft::cluster
