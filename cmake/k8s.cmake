# k8s area: the Kubernetes REST client in src/cluster/ talks HTTP(S) through libcurl.
find_package(CURL REQUIRED)
target_link_libraries(olmosft_lib PUBLIC CURL::libcurl)
