"""One controller per resource. Handlers are thin: parameters in, a query function of
`service.api.queries` called, its answer out (`service.api.respond`)."""
