#ifndef UBIQUITYFS_CCURL_SHIM_H
#define UBIQUITYFS_CCURL_SHIM_H
#include <curl/curl.h>

/* curl_easy_setopt and curl_easy_getinfo are variadic, which Swift cannot call: one typed
   wrapper per kind of argument. */
static inline CURLcode ubiquityfs_curl_set_long(CURL *h, CURLoption o, long v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode ubiquityfs_curl_set_offset(CURL *h, CURLoption o, curl_off_t v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode ubiquityfs_curl_set_string(CURL *h, CURLoption o, const char *v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode ubiquityfs_curl_set_pointer(CURL *h, CURLoption o, void *v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode ubiquityfs_curl_set_list(CURL *h, CURLoption o, struct curl_slist *v) { return curl_easy_setopt(h, o, v); }
typedef size_t (*ubiquityfs_curl_io)(char *, size_t, size_t, void *);
static inline CURLcode ubiquityfs_curl_set_io(CURL *h, CURLoption o, ubiquityfs_curl_io f) { return curl_easy_setopt(h, o, f); }
static inline long ubiquityfs_curl_response_code(CURL *h) {
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    return code;
}
#endif
