//! CUDA graphs: work captured once from a stream and replayed with one launch.

use super::{driver, sys, Context, Result, Stream};

/// A captured CUDA graph, instantiated and ready to launch.
pub struct Graph {
    _ctx: Context,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl Graph {
    /// Captures the work `record` enqueues on `stream` into a graph.
    pub fn capture(stream: &Stream, record: impl FnOnce(&Stream) -> Result<()>) -> Result<Graph> {
        let d = driver()?;
        // SAFETY: the stream is alive.
        d.check("cuStreamBeginCapture", unsafe {
            (d.api.stream_begin_capture)(stream.raw, sys::STREAM_CAPTURE_MODE_THREAD_LOCAL)
        })?;
        let recorded = record(stream);
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above, whatever `record` did.
        let end = d.check("cuStreamEndCapture", unsafe {
            (d.api.stream_end_capture)(stream.raw, &mut graph)
        });
        if let Err(e) = recorded.and(end) {
            if !graph.is_null() {
                // SAFETY: a graph the capture handed us, never instantiated.
                unsafe { (d.api.graph_destroy)(graph) };
            }
            return Err(e);
        }
        let mut exec = std::ptr::null_mut();
        // SAFETY: graph is the live graph just captured.
        if let Err(e) = d.check("cuGraphInstantiate", unsafe {
            (d.api.graph_instantiate)(&mut exec, graph, 0)
        }) {
            // SAFETY: graph is ours and not instantiated.
            unsafe { (d.api.graph_destroy)(graph) };
            return Err(e);
        }
        Ok(Graph {
            _ctx: stream.ctx.clone(),
            graph,
            exec,
        })
    }

    /// Launches the whole graph on `stream` (`cuGraphLaunch`): asynchronous, ordered after
    /// the work already queued there. The graph may be launched any number of times.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let d = driver()?;
        // SAFETY: exec and stream are alive.
        d.check("cuGraphLaunch", unsafe {
            (d.api.graph_launch)(self.exec, stream.raw)
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: both handles are ours.
            unsafe {
                (d.api.graph_exec_destroy)(self.exec);
                (d.api.graph_destroy)(self.graph);
            }
        }
    }
}
