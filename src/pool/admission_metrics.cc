// WriteMetrics(AdmissionQueue): bufpool/admission.h.
#include <string>

#include "absl/strings/str_cat.h"
#include "bufpool/admission.h"
#include "pool/metrics_writer.h"

namespace bufpool {
namespace {

// queue="name", the value escaped as the exposition format quotes it.
std::string QueueLabel(absl::string_view name) {
  return absl::StrCat("queue=\"", internal::MetricsLabelValue(name), "\"");
}

}  // namespace

void WriteMetrics(const AdmissionQueue& queue, std::string* out,
                  const MetricsOptions& options) {
  const std::string labels = internal::MetricsLabels(options.name);
  const std::string q = QueueLabel(queue.name());
  const AdmissionStats s = queue.Stats();
  const double wait = absl::ToDoubleSeconds(queue.oldest_wait());
  auto family = [&](absl::string_view name, absl::string_view type,
                    absl::string_view help, const std::string& value) {
    internal::MetricsFamily(out, name, type, help, labels, q, value);
  };
  family("bufpool_admission_queue_length", "gauge",
         "Requests waiting for memory now.", absl::StrCat(s.queue_length));
  family("bufpool_admission_oldest_wait_seconds", "gauge",
         "How long the oldest waiting request has waited (0: none waits).",
         absl::StrCat(wait));
  family("bufpool_admission_granted_buffers", "gauge",
         "Buffers held by grants now.", absl::StrCat(s.granted_buffers));
  family("bufpool_admission_capacity_buffers", "gauge",
         "The most buffers the queue grants at once.",
         absl::StrCat(s.capacity_buffers));
  family("bufpool_admission_grants_total", "counter",
         "Requests granted, at once or after waiting.", absl::StrCat(s.grants));
  family("bufpool_admission_waited_total", "counter",
         "Granted requests that waited first.", absl::StrCat(s.waited));
  family("bufpool_admission_refusals_total", "counter",
         "Requests refused because they could never be granted.",
         absl::StrCat(s.refusals));
}

}  // namespace bufpool
