/**
 * The `llama` engine: llama.cpp in process through Deno FFI, one supervised
 * child process per loaded model. Imported lazily by node/worker.ts so the
 * `openai` engine works on machines without the llama.cpp package.
 */
export { createLlamaEngine, type LlamaEngineOptions } from "./engine.ts";
