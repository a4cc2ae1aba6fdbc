/*
 * fuzz-cp-body — the control plane's parsers of peer-supplied JSON: API
 * request bodies (create, route, worker registration, resume/move targets) and
 * the worker's control-channel messages (hello, ack). Every input must be
 * accepted or refused cleanly; accepted values must satisfy the documented
 * ranges.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cap.h"
#include "reqparse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *s = (const char *)data;
	char err[160], w[SPACED_NAME_MAX];
	struct cp_create_req c;
	struct cp_route_req r;
	struct cp_worker_reg reg;
	struct cp_chan_msg m;
	if (cp_parse_create(s, size, &c, err, sizeof err) == 0) {
		if ((c.res.memory_bytes != 0 && c.res.memory_bytes < (16 << 20)) || (c.res.pids != 0 && c.res.pids < 8) ||
		    c.res.cpu_milli > SPACED_RES_CPU_MILLI_MAX || c.substrate[0] == 0)
			abort();
	}
	if (cp_parse_route(s, size, &r, err, sizeof err) == 0) {
		if (r.purposes == 0 || (r.serviceport && (r.port == 0 || r.purposes != SPACED_PURPOSE_SERVICEPORT)) ||
		    (!r.serviceport && r.port != 0))
			abort();
	}
	if (cp_parse_worker(s, size, &reg, err, sizeof err) == 0) {
		if (reg.id[0] == 0 || strncmp(reg.url, "http", 4) != 0 || reg.capacity < 1)
			abort();
	}
	cp_parse_target(s, size, "to", w, err, sizeof err);
	/* egress policies (netpolicy.h): accepted ones are canonical and parse again */
	static char net[CP_NETWORK_MAX], again[CP_NETWORK_MAX];
	if (cp_parse_network(s, size, net, err, sizeof err) == 0 &&
	    (cp_parse_network(net, strlen(net), again, err, sizeof err) != 0 || strcmp(net, again) != 0))
		abort();
	if (cp_parse_chan(s, size, &m) == 0) {
		if (m.kind == CP_CHAN_ACK && m.seq < 1)
			abort();
		free(m.result);
		free(m.tentative);
	}
	return 0;
}
